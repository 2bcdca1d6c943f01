package indexer

import (
	"math/bits"
	"math/rand/v2"

	"github.com/kvroute/kvroute"
)

// extMap maps a worker's engine block hashes to the blocks they name. It
// is an open-addressing table with linear probing whose control bytes live
// apart from the slots, as in a Swiss table: a byte per slot says whether
// it is empty, deleted, or full, and holds seven bits of the key's hash.
// Probing reads the control bytes, a sixteenth of the table's size and so
// mostly in the CPU caches, and touches a slot only when its tag matches:
// storing a new engine hash, the most common operation, costs no cache
// miss on the slots at all (only the write of its own slot).
//
// Deleted slots become tombstones, reused by later inserts, or cleared
// when they end a probe run; the table is rebuilt without them when live
// entries and tombstones fill three quarters of it, doubling when live
// entries alone fill half and halving when they fill less than an eighth. Its slots hold no pointers, so the
// garbage collector never scans them. An extMap is not safe for concurrent
// use; the index's write lock protects it.
type extMap struct {
	sink  uint64 // keeps prefetch loads from being optimised away
	ctrl  []uint8
	slots []extSlot
	count int // live entries
	used  int // live entries and tombstones
	seed  uint64
}

// extSlot is one slot of an extMap: a key and its entry packed into a
// word.
type extSlot struct {
	key kvroute.ExternalHash
	val uint64
}

// Control bytes: empty, deleted, or ctrlFull with the key's tag.
const (
	ctrlEmpty   = 0
	ctrlDeleted = 1
	ctrlFull    = 0x80
)

// pack packs e into a word: run id, position, tiers.
func (e entry) pack() uint64 { return uint64(e.id)<<32 | uint64(uint32(e.pos))<<8 | uint64(e.tiers) }

func unpack(v uint64) entry {
	return entry{id: uint32(v >> 32), pos: int32(uint32(v) >> 8), tiers: uint8(v)}
}

const extMapMinSlots = 8

func newExtMap() extMap {
	return extMap{ctrl: make([]uint8, extMapMinSlots), slots: make([]extSlot, extMapMinSlots), seed: rand.Uint64() | 1}
}

// hash returns a key's home slot and control byte. Engine hashes may be
// small consecutive integers or well-mixed hashes; a Fibonacci multiply
// with its high half folded in spreads either over the whole table.
func (m *extMap) hash(k kvroute.ExternalHash) (int, uint8) {
	x := (uint64(k) ^ m.seed) * 0x9e3779b97f4a7c15
	x ^= x >> 32
	hi, _ := bits.Mul64(x, uint64(len(m.slots)))
	return int(hi), ctrlFull | uint8(x&0x7f)
}

// find returns the slot of k, or -1.
func (m *extMap) find(k kvroute.ExternalHash) int {
	i, tag := m.hash(k)
	for {
		switch c := m.ctrl[i]; {
		case c == ctrlEmpty:
			return -1
		case c == tag && m.slots[i].key == k:
			return i
		}
		if i++; i == len(m.ctrl) {
			i = 0
		}
	}
}

// prefetch touches the home control byte and slot of each key of keys[i]
// for i in [0, n), where key returns keys[i]. The loads are independent of
// one another, so the CPU overlaps their cache misses; the operations that
// follow then find the lines in the cache instead of missing one by one.
func (m *extMap) prefetch(n int, key func(int) kvroute.ExternalHash) {
	if len(m.slots) < prefetchSlots {
		return // the table stays in the CPU caches anyway
	}
	var sum uint64
	for i := range n {
		h, _ := m.hash(key(i))
		sum += uint64(m.ctrl[h]) + uint64(m.slots[h].key)
	}
	m.sink += sum
}

// prefetchSlots is the table size from which prefetching pays: smaller
// tables (512 KiB of slots) stay in the caches of a busy core.
const prefetchSlots = 1 << 15

// next and prev return the slots after and before i, wrapping around.
func (m *extMap) next(i int) int {
	if i++; i == len(m.ctrl) {
		return 0
	}
	return i
}

func (m *extMap) prev(i int) int {
	if i == 0 {
		return len(m.ctrl) - 1
	}
	return i - 1
}

// get returns the entry for k.
func (m *extMap) get(k kvroute.ExternalHash) (entry, bool) {
	if i := m.find(k); i >= 0 {
		return unpack(m.slots[i].val), true
	}
	return entry{}, false
}

// upsert returns the packed entry of k for the caller to read and set, and
// whether k was present; an absent k is inserted with a zero word, which
// the caller must set before the next operation on the map.
func (m *extMap) upsert(k kvroute.ExternalHash) (*uint64, bool) {
	i, tag := m.hash(k)
	dead := -1
	for {
		switch c := m.ctrl[i]; {
		case c == ctrlEmpty:
			if dead < 0 {
				if (m.used+1)*4 > len(m.slots)*3 {
					m.rebuild()
					return m.upsert(k)
				}
				m.used++
				dead = i
			}
			m.ctrl[dead] = tag
			m.slots[dead] = extSlot{key: k}
			m.count++
			return &m.slots[dead].val, false
		case c == ctrlDeleted:
			if dead < 0 {
				dead = i
			}
		case c == tag && m.slots[i].key == k:
			return &m.slots[i].val, true
		}
		if i++; i == len(m.ctrl) {
			i = 0
		}
	}
}

// del removes k.
func (m *extMap) del(k kvroute.ExternalHash) {
	if i := m.find(k); i >= 0 {
		m.delAt(i)
	}
}

// delAt removes the entry in slot i, which find returned. When the slot
// after it is empty, no probe needs to pass it, so it becomes empty, and so
// do the tombstones right before it: under steady churn the table then
// rarely fills with tombstones.
func (m *extMap) delAt(i int) {
	m.count--
	if m.ctrl[m.next(i)] != ctrlEmpty {
		m.ctrl[i] = ctrlDeleted
	} else {
		m.ctrl[i] = ctrlEmpty
		m.used--
		for j := m.prev(i); m.ctrl[j] == ctrlDeleted; j = m.prev(j) {
			m.ctrl[j] = ctrlEmpty
			m.used--
		}
	}
	if len(m.slots) > extMapMinSlots && m.count*8 < len(m.slots) {
		m.rebuild()
	}
}

// rebuild rehashes the live entries into a table without tombstones.
func (m *extMap) rebuild() {
	n := len(m.slots)
	switch {
	case (m.count+1)*2 > n:
		n *= 2
	case m.count*8 < n:
		n = max(extMapMinSlots, n/2)
	}
	ctrl, slots := m.ctrl, m.slots
	m.ctrl, m.slots = make([]uint8, n), make([]extSlot, n)
	for i, c := range ctrl {
		if c < ctrlFull {
			continue
		}
		j, tag := m.hash(slots[i].key)
		for m.ctrl[j] != ctrlEmpty {
			if j++; j == n {
				j = 0
			}
		}
		m.ctrl[j] = tag
		m.slots[j] = slots[i]
	}
	m.used = m.count // no tombstones left
}

// len returns the number of entries.
func (m *extMap) len() int { return m.count }

// all calls fn for every entry, in table order.
func (m *extMap) all(fn func(kvroute.ExternalHash, entry)) {
	for i, c := range m.ctrl {
		if c >= ctrlFull {
			fn(m.slots[i].key, unpack(m.slots[i].val))
		}
	}
}

// reset empties the map and releases a large table.
func (m *extMap) reset() {
	if len(m.slots) > 1024 {
		m.ctrl, m.slots = make([]uint8, extMapMinSlots), make([]extSlot, extMapMinSlots)
	} else {
		clear(m.ctrl)
	}
	m.count, m.used = 0, 0
}
