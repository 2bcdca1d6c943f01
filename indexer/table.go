package indexer

import (
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute"
)

// nodeTable maps sequence hashes to nodes. It is an open-addressing hash
// table with linear probing whose slots carry, besides the key and the
// node, mirrors of the node's holder words for the first 64 worker slots:
// which hold the block in any tier, and which on the device. So for
// clusters of up to 64 cache domains that hold blocks on the device (the
// common case), Match reads one 32-byte slot per block, usually one cache
// miss, and never touches the node.
//
// Reads take no lock: a reader loads the slot array through an atomic
// pointer, finds the key, reads the slot's words and checks the key again,
// so a slot reused for another key while it read is noticed and treated as
// a miss. Writers serialise structural changes (inserting a key, deleting
// one, rebuilding the array) on mu's write lock, and change holder bits
// under its read lock, so bit changes of different workers run in
// parallel but never race with a rebuild that copies the slots. Deletion
// leaves a tombstone; tombstones are cleared by the rebuild that growth or
// their own number triggers.
type nodeTable struct {
	mu  sync.RWMutex // see the type's doc
	cur atomic.Pointer[slotArray]
	// low holds the keys 0 and 1, which mark empty and deleted slots in
	// the array.
	low [2]slot
}

type slot struct {
	key  atomic.Uint64
	any0 atomic.Uint64 // slots 0-63 holding the block in any tier
	dev0 atomic.Uint64 // slots 0-63 holding it on the device
	node atomic.Pointer[node]
}

const (
	keyEmpty = 0
	keyDead  = 1
)

type slotArray struct {
	slots []slot
	mask  uint64
	seed  uint64
	used  int // live keys and tombstones; under the write lock
	live  int // live keys; under the write lock
}

const minSlots = 16

func newSlotArray(n int) *slotArray {
	size := max(minSlots, 1<<bits.Len(uint(n-1)))
	return &slotArray{slots: make([]slot, size), mask: uint64(size - 1), seed: rand.Uint64() | 1}
}

func (a *slotArray) home(k uint64) uint64 {
	x := (k ^ a.seed) * 0x9e3779b97f4a7c15
	return (x ^ x>>29) & a.mask
}

func newNodeTable(hint int) *nodeTable {
	t := &nodeTable{}
	t.cur.Store(newSlotArray(hint * 2))
	return t
}

// find returns the slot of key k in the current array, or nil. Callers
// that need a consistent view use lookup; writers call find under mu.
func (t *nodeTable) find(k kvroute.SeqHash) *slot {
	if k <= keyDead {
		s := &t.low[k]
		if s.node.Load() == nil {
			return nil
		}
		return s
	}
	a := t.cur.Load()
	for i := a.home(uint64(k)); ; i = (i + 1) & a.mask {
		s := &a.slots[i]
		switch s.key.Load() {
		case uint64(k):
			return s
		case keyEmpty:
			return nil
		}
	}
}

// lookup returns the holder mirrors and node of key k without a lock, and
// false when k is absent (or was deleted while it looked).
func (t *nodeTable) lookup(k kvroute.SeqHash) (any0, dev0 uint64, n *node, ok bool) {
	s := t.find(k)
	if s == nil {
		return 0, 0, nil, false
	}
	any0, dev0, n = s.any0.Load(), s.dev0.Load(), s.node.Load()
	if n == nil || (k > keyDead && s.key.Load() != uint64(k)) {
		return 0, 0, nil, false
	}
	return any0, dev0, n, true
}

// insert adds n under its sequence hash and returns its slot; it returns
// the existing slot when the key is present. mu is write-locked.
func (t *nodeTable) insert(n *node) (*slot, bool) {
	k := uint64(n.seq)
	if k <= keyDead {
		s := &t.low[k]
		if s.node.Load() != nil {
			return s, false
		}
		s.any0.Store(0)
		s.dev0.Store(0)
		s.node.Store(n)
		return s, true
	}
	a := t.cur.Load()
	if (a.used+1)*10 > len(a.slots)*7 {
		a = t.rebuild(a.live + 1)
	}
	var free *slot
	for i := a.home(k); ; i = (i + 1) & a.mask {
		s := &a.slots[i]
		switch s.key.Load() {
		case k:
			return s, false
		case keyDead:
			if free == nil {
				free = s
			}
			continue
		case keyEmpty:
			if free == nil {
				free = s
				a.used++
			}
		default:
			continue
		}
		break
	}
	free.any0.Store(0)
	free.dev0.Store(0)
	free.node.Store(n)
	free.key.Store(k) // publish last: readers that see the key see the rest
	a.live++
	return free, true
}

// sweep deletes every node for which drop returns true, rebuilds the
// array without tombstones, and returns the deleted nodes. mu is
// write-locked.
func (t *nodeTable) sweep(drop func(*node) bool) []*node {
	var out []*node
	for k := range t.low {
		if n := t.low[k].node.Load(); n != nil && drop(n) {
			t.low[k].node.Store(nil)
			out = append(out, n)
		}
	}
	a := t.cur.Load()
	for i := range a.slots {
		s := &a.slots[i]
		if s.key.Load() <= keyDead {
			continue
		}
		if n := s.node.Load(); drop(n) {
			s.key.Store(keyDead)
			s.node.Store(nil)
			a.live--
			out = append(out, n)
		}
	}
	t.rebuild(a.live)
	return out
}

// rebuild copies the live slots into a fresh array sized for live keys at
// half load and publishes it. mu is write-locked.
func (t *nodeTable) rebuild(live int) *slotArray {
	old := t.cur.Load()
	a := newSlotArray(live * 2)
	for i := range old.slots {
		s := &old.slots[i]
		k := s.key.Load()
		if k <= keyDead {
			continue
		}
		for j := a.home(k); ; j = (j + 1) & a.mask {
			d := &a.slots[j]
			if d.key.Load() == keyEmpty {
				d.any0.Store(s.any0.Load())
				d.dev0.Store(s.dev0.Load())
				d.node.Store(s.node.Load())
				d.key.Store(k)
				break
			}
		}
		a.used++
		a.live++
	}
	t.cur.Store(a)
	return a
}

// bytes returns the memory of the slot array.
func (t *nodeTable) bytes() int64 {
	return int64(len(t.cur.Load().slots)) * 32
}
