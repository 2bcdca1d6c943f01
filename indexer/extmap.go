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

// extSlot is one slot of an extMap: a key and its entry packed into a
// word, with no pointers, so that the garbage collector never scans the
// maps. It is empty when the entry's tiers are zero, since every entry
// holds its block in at least one tier.
type extSlot struct {
	key kvroute.ExternalHash
	val uint64
}

// pack packs e into a word: run id, position, tiers.
func (e entry) pack() uint64 { return uint64(e.id)<<32 | uint64(uint32(e.pos))<<8 | uint64(e.tiers) }

func unpack(v uint64) entry { return entry{id: uint32(v >> 32), pos: int32(uint32(v) >> 8), tiers: uint8(v)} }

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
		if s.val == 0 {
			return entry{}, false
		}
		if s.key == k {
			return unpack(s.val), true
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
		if s.val == 0 {
			*s = extSlot{key: k, val: e.pack()}
			m.count++
			return
		}
		if s.key == k {
			s.val = e.pack()
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
		if s.val == 0 {
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
		if s.val == 0 {
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
		if s.val != 0 {
			m.put(s.key, unpack(s.val))
		}
	}
}

// len returns the number of entries.
func (m *extMap) len() int { return m.count }

// all calls fn for every entry, in table order.
func (m *extMap) all(fn func(kvroute.ExternalHash, entry)) {
	for _, s := range m.slots {
		if s.val != 0 {
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
