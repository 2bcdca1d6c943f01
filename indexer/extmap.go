package indexer

import (
	"math/bits"
	"math/rand/v2"

	"github.com/kvroute/kvroute"
)

// extMap maps a worker's engine block hashes to the blocks they name. It is
// an open-addressing table with linear probing and backward-shift deletion,
// so it keeps no tombstones: engines store and evict blocks all the time,
// and a table that only marks deleted slots (as Go's built-in map does until
// it grows) lets its probe sequences grow without bound under that churn.
//
// Its capacity is not a power of two: it grows by half (and a key's home
// slot is its hash scaled to the capacity), so that a table stays between
// half and three quarters full instead of dropping to three eighths after
// each doubling. An extMap is not safe for concurrent use; the owning
// worker's mutex protects it.
type extMap struct {
	slots []extSlot
	count int
	seed  uint64
}

// extSlot is one slot of an extMap; it is empty when tiers is zero, since
// every entry holds its block in at least one tier.
type extSlot struct {
	key kvroute.ExternalHash
	entry
}

const extMapMinSlots = 8

func newExtMap() extMap {
	return extMap{slots: make([]extSlot, extMapMinSlots), seed: rand.Uint64() | 1}
}

// home returns the slot a key hashes to. Engine hashes may be small
// consecutive integers or well-mixed hashes; the splitmix64 finalizer
// spreads either over the whole table.
func (m *extMap) home(k kvroute.ExternalHash) int {
	x := uint64(k) ^ m.seed
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	hi, _ := bits.Mul64(x, uint64(len(m.slots)))
	return int(hi)
}

// next returns the slot after i, wrapping around.
func (m *extMap) next(i int) int {
	if i++; i == len(m.slots) {
		return 0
	}
	return i
}

// get returns the entry for k.
func (m *extMap) get(k kvroute.ExternalHash) (entry, bool) {
	for i := m.home(k); ; i = m.next(i) {
		s := &m.slots[i]
		if s.tiers == 0 {
			return entry{}, false
		}
		if s.key == k {
			return s.entry, true
		}
	}
}

// put sets the entry for k; e.tiers must not be zero.
func (m *extMap) put(k kvroute.ExternalHash, e entry) {
	if (m.count+1)*4 > len(m.slots)*3 {
		m.resize(len(m.slots) + len(m.slots)/2)
	}
	for i := m.home(k); ; i = m.next(i) {
		s := &m.slots[i]
		if s.tiers == 0 {
			*s = extSlot{key: k, entry: e}
			m.count++
			return
		}
		if s.key == k {
			s.entry = e
			return
		}
	}
}

// del removes k, shifting later members of its probe run back so that no
// tombstone is left.
func (m *extMap) del(k kvroute.ExternalHash) {
	i := m.home(k)
	for {
		s := &m.slots[i]
		if s.tiers == 0 {
			return
		}
		if s.key == k {
			break
		}
		i = m.next(i)
	}
	m.count--
	for j := m.next(i); ; j = m.next(j) {
		s := m.slots[j]
		if s.tiers == 0 {
			break
		}
		// s may move to i if its home is not in the cyclic range (i, j].
		h := m.home(s.key)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			m.slots[i] = s
			i = j
		}
	}
	m.slots[i] = extSlot{}
	if len(m.slots) > extMapMinSlots && m.count*8 < len(m.slots) {
		m.resize(max(extMapMinSlots, len(m.slots)/2))
	}
}

func (m *extMap) resize(n int) {
	old := m.slots
	m.slots = make([]extSlot, n)
	m.count = 0
	for _, s := range old {
		if s.tiers != 0 {
			m.put(s.key, s.entry)
		}
	}
}

// len returns the number of entries.
func (m *extMap) len() int { return m.count }

// all calls fn for every entry, in table order.
func (m *extMap) all(fn func(kvroute.ExternalHash, entry)) {
	for _, s := range m.slots {
		if s.tiers != 0 {
			fn(s.key, s.entry)
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
