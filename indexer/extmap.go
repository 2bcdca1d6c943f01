package indexer

import (
	"math/bits"
	"math/rand/v2"

	"github.com/kvroute/kvroute"
)

// extMap maps a worker's engine block hashes to the blocks they name. It
// is an open-addressing table with linear probing over slots of a key and
// its packed entry: looking a key up, inserting one and deleting one touch
// one slot, and so usually one cache line (a table with control bytes kept
// apart would touch two). A slot is empty when its entry word is zero (a
// live entry always has a tier).
//
// Deletion shifts the entries after the deleted one back (backward-shift
// deletion), so the table never holds tombstones: under steady churn, as
// when an engine evicts as much as it stores, probe sequences stay as
// short as at insertion and no rebuild is needed to clean them. The table
// doubles when live entries would fill more than maxLoadNum/maxLoadDen of
// it and halves when they fill less than an eighth.
// Its slots hold no pointers, so the garbage collector never scans them.
// An extMap is not safe for concurrent use; the index's write lock
// protects it.
type extMap struct {
	sink  uint64 // keeps prefetch loads from being optimised away
	slots []extSlot
	count int // live entries
	seed  uint64
}

// extSlot is one slot of an extMap: a key and its entry packed into a
// word (extEmpty, or an entry with at least one tier).
type extSlot struct {
	key kvroute.ExternalHash
	val uint64
}

// extEmpty is the entry word of an empty slot.
const extEmpty = 0

// The table grows when live entries would fill more than
// maxLoadNum/maxLoadDen of its slots.
const (
	maxLoadNum = 5
	maxLoadDen = 8
)

// pack packs e into a word: run id, position, tiers.
func (e entry) pack() uint64 { return uint64(e.id)<<32 | uint64(uint32(e.pos))<<8 | uint64(e.tiers) }

func unpack(v uint64) entry {
	return entry{id: uint32(v >> 32), pos: int32(uint32(v) >> 8), tiers: uint8(v)}
}

const extMapMinSlots = 8

func newExtMap() extMap {
	return extMap{slots: make([]extSlot, extMapMinSlots), seed: rand.Uint64() | 1}
}

// hash returns a key's home slot. Engine hashes may be small consecutive
// integers or well-mixed hashes; a Fibonacci multiply with its high half
// folded in spreads either over the whole table.
func (m *extMap) hash(k kvroute.ExternalHash) int {
	x := (uint64(k) ^ m.seed) * 0x9e3779b97f4a7c15
	x ^= x >> 32
	hi, _ := bits.Mul64(x, uint64(len(m.slots)))
	return int(hi)
}

// find returns the slot of k, or -1.
func (m *extMap) find(k kvroute.ExternalHash) int {
	i := m.hash(k)
	for {
		s := &m.slots[i]
		switch {
		case s.val == extEmpty:
			return -1
		case s.key == k:
			return i
		}
		if i++; i == len(m.slots) {
			i = 0
		}
	}
}

// prefetch touches the home slot of each key of keys[i] for i in [0, n),
// where key returns keys[i]. The loads are independent of one another, so
// the CPU overlaps their cache misses; the operations that follow then
// find the lines in the cache instead of missing one by one.
func (m *extMap) prefetch(n int, key func(int) kvroute.ExternalHash) {
	if len(m.slots) < prefetchSlots {
		return // the table stays in the CPU caches anyway
	}
	var sum uint64
	for i := range n {
		sum += m.slots[m.hash(key(i))].val
	}
	m.sink += sum
}

// prefetchSlots is the table size from which prefetching pays: smaller
// tables (64 KiB of slots) stay in the caches of a busy core.
const prefetchSlots = 1 << 12

// next and prev return the slots after and before i, wrapping around.
func (m *extMap) next(i int) int {
	if i++; i == len(m.slots) {
		return 0
	}
	return i
}

func (m *extMap) prev(i int) int {
	if i == 0 {
		return len(m.slots) - 1
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
// whether k was present; an absent k is inserted with an empty word, which
// the caller must set to an entry with a tier before the next operation on
// the map.
func (m *extMap) upsert(k kvroute.ExternalHash) (*uint64, bool) {
	i := m.hash(k)
	for {
		s := &m.slots[i]
		switch {
		case s.val == extEmpty:
			if (m.count+1)*maxLoadDen > len(m.slots)*maxLoadNum {
				m.resize(2 * len(m.slots))
				return m.upsert(k)
			}
			s.key = k
			m.count++
			return &s.val, false
		case s.key == k:
			return &s.val, true
		}
		if i++; i == len(m.slots) {
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

// delAt removes the entry in slot i, which find returned, and moves back
// into the hole each later entry of the probe run that may live there (one
// whose home is not between the hole and its slot), so that every entry
// stays reachable from its home without tombstones.
func (m *extMap) delAt(i int) {
	m.count--
	n := len(m.slots)
	for j := m.next(i); m.slots[j].val != extEmpty; j = m.next(j) {
		// The entry at j stays when its home h is cyclically in (i, j].
		h := m.hash(m.slots[j].key)
		if i < j {
			if i < h && h <= j {
				continue
			}
		} else if h > i || h <= j {
			continue
		}
		m.slots[i] = m.slots[j]
		i = j
	}
	m.slots[i] = extSlot{}
	if n > extMapMinSlots && m.count*8 < n {
		m.resize(n / 2)
	}
}

// resize rehashes the entries into a table of n slots.
func (m *extMap) resize(n int) {
	slots := m.slots
	m.slots = make([]extSlot, max(extMapMinSlots, n))
	n = len(m.slots)
	for _, s := range slots {
		if s.val == extEmpty {
			continue
		}
		j := m.hash(s.key)
		for m.slots[j].val != extEmpty {
			if j++; j == n {
				j = 0
			}
		}
		m.slots[j] = s
	}
}

// len returns the number of entries.
func (m *extMap) len() int { return m.count }

// all calls fn for every entry, in table order.
func (m *extMap) all(fn func(kvroute.ExternalHash, entry)) {
	for _, s := range m.slots {
		if s.val != extEmpty {
			fn(s.key, unpack(s.val))
		}
	}
}

// reset empties the map and releases a large table.
func (m *extMap) reset() {
	if len(m.slots) > 1024 {
		m.slots = make([]extSlot, extMapMinSlots)
	} else {
		clear(m.slots)
	}
	m.count = 0
}
