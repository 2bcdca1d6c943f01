package indexer

import (
	"math/bits"
	"math/rand/v2"

	"github.com/kvroute/kvroute"
)

// extMap maps a worker's engine block hashes to the blocks they name. It
// is an open-addressing table with linear probing over slots of a key and
// its packed entry, beside an array of one control byte per slot: zero
// for an empty slot, else a 7-bit fingerprint of the key's hash with the
// top bit set. Probing reads the control bytes, which take a sixteenth of
// the slots' memory and so stay in the CPU caches, and reads a slot only
// where the fingerprint matches: inserting a new key (every block an
// engine stores) reads no slot at all and only writes one, a store the
// CPU does not wait for, and a lookup reads the one slot it finds.
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
	ctrl  []uint8
	slots []extSlot
	count int // live entries
	seed  uint64
}

// extSlot is one slot of an extMap: a key and its entry packed into a
// word. Its contents are meaningless when its control byte is zero.
type extSlot struct {
	key kvroute.ExternalHash
	val uint64
}

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
	return extMap{ctrl: make([]uint8, extMapMinSlots), slots: make([]extSlot, extMapMinSlots), seed: rand.Uint64() | 1}
}

// mix returns the bits of k under seed from which a key's home slot (the
// high bits) and its control byte (the low ones) are taken: a Fibonacci
// multiply with its high half folded in, which spreads engine hashes that
// are small consecutive integers as well as well-mixed ones.
func mix(k kvroute.ExternalHash, seed uint64) uint64 {
	x := (uint64(k) ^ seed) * 0x9e3779b97f4a7c15
	return x ^ x>>32
}

// home returns the home slot of the mixed hash x in a table of n slots.
func home(x uint64, n int) int {
	hi, _ := bits.Mul64(x, uint64(n))
	return int(hi)
}

// fingerprint returns the control byte of the mixed hash x.
func fingerprint(x uint64) uint8 { return uint8(x) | 0x80 }

// hash returns k's home slot.
func (m *extMap) hash(k kvroute.ExternalHash) int { return home(mix(k, m.seed), len(m.slots)) }

// find returns the slot of k, or -1.
func (m *extMap) find(k kvroute.ExternalHash) int {
	x := mix(k, m.seed)
	fp := fingerprint(x)
	ctrl := m.ctrl
	for i := home(x, len(ctrl)); ; {
		switch c := ctrl[i]; {
		case c == 0:
			return -1
		case c == fp && m.slots[i].key == k:
			return i
		}
		if i++; i == len(ctrl) {
			i = 0
		}
	}
}

// prefetch touches the slot at the home of each key of keys[i] for i in
// [0, min(n, prefetchAhead)), where key returns keys[i]; the loop that
// then looks the keys up touches key i+prefetchAhead as it reaches key i
// (touch). The loads are independent of one another, so the CPU overlaps
// their cache misses, and each lookup finds its slot's line in the cache
// instead of missing one by one. Touching a window ahead rather than
// every key first keeps the lines in the fastest cache until they are
// used, however many keys an event names.
func (m *extMap) prefetch(n int, key func(int) kvroute.ExternalHash) {
	if !m.prefetching() {
		return // the table stays in the CPU caches anyway
	}
	var sum uint64
	for i := range min(n, prefetchAhead) {
		sum += m.slots[m.hash(key(i))].val
	}
	m.sink += sum
}

// prefetching reports whether the table is large enough for prefetch and
// touch to pay.
func (m *extMap) prefetching() bool { return len(m.slots) >= prefetchSlots }

// touch loads the slot at k's home into the cache (see prefetch).
func (m *extMap) touch(k kvroute.ExternalHash) {
	m.sink += m.slots[m.hash(k)].val
}

// prefetchSlots is the table size from which prefetching pays: smaller
// tables (64 KiB of slots) stay in the caches of a busy core.
// prefetchAhead is how many keys ahead of the one looked up prefetch and
// touch load.
const (
	prefetchSlots = 1 << 12
	prefetchAhead = 16
)

// next returns the slot after i, wrapping around.
func (m *extMap) next(i int) int {
	if i++; i == len(m.slots) {
		return 0
	}
	return i
}

// get returns the entry for k.
func (m *extMap) get(k kvroute.ExternalHash) (entry, bool) {
	if i := m.find(k); i >= 0 {
		return unpack(m.slots[i].val), true
	}
	return entry{}, false
}

// upsert returns the packed entry of k for the caller to read and set, and
// whether k was present; an absent k is inserted with an entry the caller
// must set before the next operation on the map.
func (m *extMap) upsert(k kvroute.ExternalHash) (*uint64, bool) {
	x := mix(k, m.seed)
	fp := fingerprint(x)
	ctrl := m.ctrl
	for i := home(x, len(ctrl)); ; {
		switch c := ctrl[i]; {
		case c == 0:
			if (m.count+1)*maxLoadDen > len(ctrl)*maxLoadNum {
				m.resize(2 * len(ctrl))
				return m.upsert(k)
			}
			ctrl[i] = fp
			s := &m.slots[i]
			s.key = k
			m.count++
			return &s.val, false
		case c == fp && m.slots[i].key == k:
			return &m.slots[i].val, true
		}
		if i++; i == len(ctrl) {
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
	for j := m.next(i); m.ctrl[j] != 0; j = m.next(j) {
		// The entry at j stays when its home h is cyclically in (i, j].
		h := m.hash(m.slots[j].key)
		if i < j {
			if i < h && h <= j {
				continue
			}
		} else if h > i || h <= j {
			continue
		}
		m.ctrl[i], m.slots[i] = m.ctrl[j], m.slots[j]
		i = j
	}
	m.ctrl[i] = 0
	if n > extMapMinSlots && m.count*8 < n {
		m.resize(n / 2)
	}
}

// resize rehashes the entries into a table of n slots. It works on local
// copies of the map's fields, which the stores into the new table would
// otherwise make the compiler reload for every entry.
func (m *extMap) resize(n int) {
	oldCtrl, oldSlots, seed := m.ctrl, m.slots, m.seed
	n = max(extMapMinSlots, n)
	ctrl, slots := make([]uint8, n), make([]extSlot, n)
	m.ctrl, m.slots = ctrl, slots
	for i, c := range oldCtrl {
		if c == 0 {
			continue
		}
		s := oldSlots[i]
		j := home(mix(s.key, seed), n)
		for ctrl[j] != 0 {
			if j++; j == n {
				j = 0
			}
		}
		ctrl[j], slots[j] = c, s
	}
}

// len returns the number of entries.
func (m *extMap) len() int { return m.count }

// all calls fn for every entry, in table order.
func (m *extMap) all(fn func(kvroute.ExternalHash, entry)) {
	for i, c := range m.ctrl {
		if c != 0 {
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
	m.count = 0
}
