package indexer

import (
	"math/bits"
	"math/rand/v2"
	"sync/atomic"
	"unsafe"

	"github.com/kvroute/kvroute"
)

// blockTable maps the sequence hash of every head block to its place: the
// run that holds it and its position there. A head is the first block of a
// run, the one block of it that a walk down its parent's run cannot reach;
// dead run starts stay while their run has live positions (see
// Index.died). Match looks a head up when a request leaves a run; writers
// look one up when a block branches off its parent's run.
//
// It is an open-addressing table with linear probing. Reads take no lock:
// a reader loads the slot array through an atomic pointer, finds the key
// and loads the slot's run and position, then checks that the run is alive
// at that position and holds the key there. A slot the writer changed while
// it read, or an array the writer replaced, fails that check and the reader
// looks again. There is one writer at a time (the index's write lock).
// Deleted keys leave tombstones that later inserts reuse; the array is
// rebuilt when live keys and tombstones fill three quarters of it.
type blockTable struct {
	cur atomic.Pointer[tableArray]
	// low holds the keys 0 and 1, which mark empty and deleted slots in
	// the array.
	low   [2]tableSlot
	count atomic.Int64 // keys held
}

// tableSlot is one slot: a key, its run and its position in the run.
type tableSlot struct {
	key atomic.Uint64
	run atomic.Pointer[run]
	pos atomic.Int32
}

const (
	keyEmpty = 0
	keyDead  = 1
)

type tableArray struct {
	slots []tableSlot
	seed  uint64
	used  int // live keys and tombstones; writer only
	live  int // live keys; writer only
}

const minTableSlots = 16

func newTableArray(n int) *tableArray {
	return &tableArray{slots: make([]tableSlot, max(minTableSlots, n)), seed: rand.Uint64()}
}

// home returns the slot a key hashes to: its mixed hash scaled to the
// array's length, so that the length need not be a power of two.
func (a *tableArray) home(k uint64) int {
	x := k ^ a.seed
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	hi, _ := bits.Mul64(x, uint64(len(a.slots)))
	return int(hi)
}

func newBlockTable(hint int) *blockTable {
	t := &blockTable{}
	t.cur.Store(newTableArray(hint * 2))
	return t
}

// read returns the slot contents of k as a reader sees them, without
// checking them against the run; found is false when k is absent.
func (t *blockTable) read(k kvroute.SeqHash) (*run, int, bool) {
	if k <= keyDead {
		s := &t.low[k]
		n := s.run.Load()
		return n, int(s.pos.Load()), n != nil
	}
	a := t.cur.Load()
	for i := a.home(uint64(k)); ; {
		s := &a.slots[i]
		switch s.key.Load() {
		case uint64(k):
			// A concurrent delete may have cleared the run: a miss.
			n := s.run.Load()
			return n, int(s.pos.Load()), n != nil
		case keyEmpty:
			return nil, 0, false
		}
		if i++; i == len(a.slots) {
			i = 0
		}
	}
}

// find returns the slot of k, or nil. Writer only.
func (t *blockTable) find(k kvroute.SeqHash) *tableSlot {
	if k <= keyDead {
		s := &t.low[k]
		if s.run.Load() == nil {
			return nil
		}
		return s
	}
	a := t.cur.Load()
	for i := a.home(uint64(k)); ; {
		s := &a.slots[i]
		switch s.key.Load() {
		case uint64(k):
			return s
		case keyEmpty:
			return nil
		}
		if i++; i == len(a.slots) {
			i = 0
		}
	}
}

// get returns the run and position of k, for the writer.
func (t *blockTable) get(k kvroute.SeqHash) (*run, int, bool) {
	s := t.find(k)
	if s == nil {
		return nil, 0, false
	}
	return s.run.Load(), int(s.pos.Load()), true
}

// put sets the place of k, inserting it when absent. Writer only.
func (t *blockTable) put(k kvroute.SeqHash, n *run, off int) {
	if k <= keyDead {
		s := &t.low[k]
		if s.run.Load() == nil {
			publishInt64(&t.count, t.count.Load()+1)
		}
		publishInt32(&s.pos, int32(off))
		publishPointer(&s.run, n)
		return
	}
	a := t.cur.Load()
	var dead *tableSlot
	for i := a.home(uint64(k)); ; {
		s := &a.slots[i]
		switch s.key.Load() {
		case uint64(k):
			publishPointer(&s.run, n)
			publishInt32(&s.pos, int32(off))
			return
		case keyDead:
			if dead == nil {
				dead = s
			}
		case keyEmpty:
			if dead == nil {
				if (a.used+1)*4 > len(a.slots)*3 {
					t.rebuild(a)
					t.put(k, n, off)
					return
				}
				a.used++
				dead = s
			}
			a.live++
			publishInt64(&t.count, t.count.Load()+1)
			publishPointer(&dead.run, n)
			publishInt32(&dead.pos, int32(off))
			publishUint64(&dead.key, uint64(k))
			return
		}
		if i++; i == len(a.slots) {
			i = 0
		}
	}
}

// del removes k. Writer only.
func (t *blockTable) del(k kvroute.SeqHash) {
	if s := t.find(k); s != nil {
		t.delSlot(k, s)
	}
}

// delSlot removes k, found in slot s. As in extMap.take, the slot and
// the tombstones before it become empty when the slot after it is empty.
func (t *blockTable) delSlot(k kvroute.SeqHash, s *tableSlot) {
	publishPointer(&s.run, nil)
	publishInt64(&t.count, t.count.Load()-1)
	if k <= keyDead {
		return
	}
	a := t.cur.Load()
	a.live--
	i := int((uintptr(unsafe.Pointer(s)) - uintptr(unsafe.Pointer(&a.slots[0]))) / unsafe.Sizeof(*s))
	if a.slots[(i+1)%len(a.slots)].key.Load() != keyEmpty {
		publishUint64(&s.key, keyDead)
		return
	}
	publishUint64(&s.key, keyEmpty)
	a.used--
	for j := (i + len(a.slots) - 1) % len(a.slots); a.slots[j].key.Load() == keyDead; j = (j + len(a.slots) - 1) % len(a.slots) {
		publishUint64(&a.slots[j].key, keyEmpty)
		a.used--
	}
}

// rebuild replaces a with an array without tombstones, grown by half when
// live keys fill more than half of it and halved when they fill less than
// an eighth.
func (t *blockTable) rebuild(a *tableArray) {
	n := len(a.slots)
	switch {
	case 2*(a.live+1) > n:
		n += n / 2
	case 8*a.live < n:
		n /= 2
	}
	b := newTableArray(n)
	for i := range a.slots {
		s := &a.slots[i]
		k := s.key.Load()
		if k <= keyDead {
			continue
		}
		for j := b.home(k); ; {
			d := &b.slots[j]
			if d.key.Load() == keyEmpty {
				publishPointer(&d.run, s.run.Load())
				publishInt32(&d.pos, s.pos.Load())
				publishUint64(&d.key, k)
				break
			}
			if j++; j == len(b.slots) {
				j = 0
			}
		}
	}
	b.live, b.used = a.live, a.live
	publishPointer(&t.cur, b)
}

// each calls fn with the place of every key. Writer only.
func (t *blockTable) each(fn func(*run, int)) {
	for i := range t.low {
		if n := t.low[i].run.Load(); n != nil {
			fn(n, int(t.low[i].pos.Load()))
		}
	}
	a := t.cur.Load()
	for i := range a.slots {
		s := &a.slots[i]
		if s.key.Load() > keyDead {
			fn(s.run.Load(), int(s.pos.Load()))
		}
	}
}

// len returns the number of keys.
func (t *blockTable) len() int { return int(t.count.Load()) }

// bytes returns the memory of the slot array.
func (t *blockTable) bytes() int64 {
	return int64(len(t.cur.Load().slots)) * tableSlotBytes
}

const tableSlotBytes = 24
