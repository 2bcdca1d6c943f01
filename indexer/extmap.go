package indexer

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"unsafe"

	"github.com/kvroute/kvroute"
)

// extMap maps a worker's engine block hashes to the blocks they name. It
// is an open-addressing hash table of slots holding a key and its packed
// entry, beside an array of one control byte per slot: zero for an empty
// slot, ctrlDeleted for a deleted one (a tombstone), else a 7-bit
// fingerprint of the key's hash with the top bit set. The slots form
// aligned groups of eight whose control bytes are read as one word: a key
// lives in its home group or, when that group was full, in one of the
// groups after it, and a probe finds the key's fingerprint and the empty
// slots of a group with word arithmetic, not a branch per slot, and stops
// at the first group with an empty slot. A new key takes the first free
// slot of the first group with one, so keys fill a group from its start,
// where prefetching looks. The control bytes take a sixteenth of the
// slots' memory and so stay in the CPU caches, and a probe reads a slot
// only where the fingerprint matches: inserting a new key (every block an
// engine stores) reads no slot at all and only writes one, and a lookup
// reads the one slot it finds.
//
// Deleting a key (every block an engine evicts) writes its control byte
// only: empty when its group has another empty slot, as it almost always
// has (no probe goes past that group), else a tombstone, which probes pass
// over and inserts reuse. The table doubles when live keys would fill more
// than maxLoadNum/maxLoadDen of it, is rebuilt without tombstones when
// they and the live keys would, and halves when live keys fill less than
// an eighth, down to its floor: the size reserve gave it for the keys a
// worker's cache is expected to hold.
// Its slots hold no pointers, so the garbage collector never scans them.
// An extMap is not safe for concurrent use; the index's write lock
// protects it.
type extMap struct {
	ctrl  []uint8
	slots []extSlot
	count int // live entries
	room  int // empty slots live keys may still take before the table is rebuilt: len(slots)·maxLoadNum/maxLoadDen less the live entries and tombstones
	floor int // the table never shrinks below this many slots
	seed  uint64
	shift uint // 64 - log2(len(slots)): a hash's top bits name its home slot
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

// extMapMinSlots is the smallest table: one group.
const extMapMinSlots = groupWidth

// groupWidth is the number of slots in a group, whose control bytes a
// probe reads as one word.
const groupWidth = 8

// ctrlDeleted is the control byte of a deleted slot. Its high bit is
// clear, like an empty slot's, and it is not zero: matchEmpty tells the
// two apart exactly.
const ctrlDeleted = 0x7f

// Masks for matching the bytes of a group word.
const (
	lsbs = 0x0101010101010101 // the low bit of every byte
	msbs = 0x8080808080808080 // the high bit of every byte
)

func newExtMap() extMap {
	return extMap{ctrl: make([]uint8, extMapMinSlots), slots: make([]extSlot, extMapMinSlots), floor: extMapMinSlots,
		seed: rand.Uint64() | 1, shift: shiftFor(extMapMinSlots), room: loadLimit(extMapMinSlots)}
}

// maxReserveKeys caps a reservation: a table of 2^23 slots, 136 MiB.
const maxReserveKeys = 1 << 22

// slotsFor returns the table size that holds keys live keys without
// growing: the power of two at or above keys·maxLoadDen/maxLoadNum, as a
// table that grows from extMapMinSlots reaches (keys at most
// maxReserveKeys).
func slotsFor(keys int) int {
	need := (min(keys, maxReserveKeys)*maxLoadDen + maxLoadNum - 1) / maxLoadNum
	if need <= extMapMinSlots {
		return extMapMinSlots
	}
	return 1 << bits.Len(uint(need-1))
}

// reserve makes the table large enough for keys live keys, growing it now
// when it is smaller, and keeps it from shrinking below that size: a
// worker's cache fills to its capacity and stays about there, and a table
// that starts at that size is spared the rebuilds of growing from a group
// (each rehashes every key, and the outgrown tables are garbage). keys at
// or below zero lift the floor.
func (m *extMap) reserve(keys int) {
	if keys <= 0 {
		m.floor = extMapMinSlots
		return
	}
	m.floor = slotsFor(keys)
	if len(m.slots) < m.floor {
		m.resize(m.floor)
	}
}

// mix returns the bits of k under seed from which a key's home slot (the
// high bits) and its control byte (the low ones) are taken: a Fibonacci
// multiply with its high half folded in, which spreads engine hashes that
// are small consecutive integers as well as well-mixed ones.
func mix(k kvroute.ExternalHash, seed uint64) uint64 {
	x := (uint64(k) ^ seed) * 0x9e3779b97f4a7c15
	return x ^ x>>32
}

// homeSlot returns the home slot of the mixed hash x in a table whose
// shift is shift: its top bits.
func homeSlot(x uint64, shift uint) int { return int(x >> shift) }

// shiftFor returns the shift of a table of n slots, a power of two.
func shiftFor(n int) uint { return uint(64 - bits.TrailingZeros(uint(n))) }

// fingerprint returns the control byte of the mixed hash x.
func fingerprint(x uint64) uint8 { return uint8(x) | 0x80 }

// hash returns k's home slot.
func (m *extMap) hash(k kvroute.ExternalHash) int { return homeSlot(mix(k, m.seed), m.shift) }

// find returns the slot of k, or -1.
func (m *extMap) find(k kvroute.ExternalHash) int {
	x := mix(k, m.seed)
	fp := fingerprint(x)
	n := len(m.slots)
	for g := homeSlot(x, m.shift) &^ (groupWidth - 1); ; {
		w := m.group(g)
		for cand := matchByte(w, fp); cand != 0; cand &= cand - 1 {
			if j := g + bits.TrailingZeros64(cand)>>3; m.slotAt(j).key == k {
				return j
			}
		}
		if matchEmpty(w) != 0 {
			return -1
		}
		if g += groupWidth; g == n {
			g = 0
		}
	}
}

// group returns the control bytes of the group that starts at slot g as
// a little-endian word.
//
// group, ctrlAt and slotAt do not check their slot numbers: every caller
// passes one below len(m.slots), derived from a home slot (always below
// it) by the aligned group arithmetic of the probes, so that a group's
// eight bytes and slots lie in the table. The bounds checks that indexing
// does would add a compare and a branch to every step of every probe, in
// the loops that take most of an index's write time.
func (m *extMap) group(g int) uint64 {
	return binary.LittleEndian.Uint64((*[groupWidth]byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(m.ctrl)), g))[:])
}

// ctrlAt returns the control byte of slot i (see group).
func (m *extMap) ctrlAt(i int) *uint8 {
	return (*uint8)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(m.ctrl)), i))
}

// slotAt returns slot i (see group).
func (m *extMap) slotAt(i int) *extSlot {
	return (*extSlot)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(m.slots)), uintptr(i)*unsafe.Sizeof(extSlot{})))
}

// matchByte returns the high bit of every byte of w equal to fp, a full
// slot's control byte, and possibly of full slots' bytes above such a byte
// (a borrow): callers check the key of every slot it names. It never names
// an empty or deleted slot: their bytes differ from fp in the high bit.
func matchByte(w uint64, fp uint8) uint64 {
	x := w ^ lsbs*uint64(fp)
	return (x - lsbs) &^ x & msbs
}

// matchEmpty returns the high bit of every byte of w that is an empty
// slot's, exactly: a borrow from a zero byte turns no other control byte
// (ctrlDeleted or a full slot's) into a match.
func matchEmpty(w uint64) uint64 { return (w - lsbs) &^ w & msbs }

// matchFree returns the high bit of every byte of w that is an empty or
// deleted slot's.
func matchFree(w uint64) uint64 { return ^w & msbs }

// prefetch asks the CPU for the lines that looking up keys[i] reads, for
// i in [0, min(n, prefetchAhead)), where key returns keys[i]: the key's
// control byte and its home group's slots (the group of almost every key
// a table holds). The loop that then looks the keys up asks for key
// i+prefetchAhead as it reaches key i (touch). A prefetch instruction does not wait for its line, so the
// misses of many keys overlap, and each lookup finds its lines in the
// cache instead of missing one by one. Asking a window ahead rather than
// for every key first keeps the lines in the fastest cache until they are
// used, however many keys an event names.
func (m *extMap) prefetch(n int, key func(int) kvroute.ExternalHash) {
	if !m.prefetching() {
		return // the table stays in the CPU caches anyway
	}
	for i := range min(n, prefetchAhead) {
		m.touch(key(i))
	}
}

// prefetching reports whether the table is large enough for prefetch,
// touch and touchHome to pay.
func (m *extMap) prefetching() bool { return len(m.slots) >= prefetchSlots }

// touch asks for the lines a lookup of k reads: its control byte and its
// home group's slots, two cache lines (see prefetch).
func (m *extMap) touch(k kvroute.ExternalHash) {
	h := m.hash(k)
	g := h &^ (groupWidth - 1)
	prefetchLines3(unsafe.Pointer(&m.ctrl[h]), unsafe.Pointer(&m.slots[g]), unsafe.Pointer(&m.slots[g+groupWidth/2]))
}

// touchHome asks for the lines that inserting the new key k into its home
// slot writes (upsertAt with home set): its control byte and its slot.
func (m *extMap) touchHome(k kvroute.ExternalHash) {
	h := m.hash(k)
	prefetchLines2(unsafe.Pointer(&m.ctrl[h]), unsafe.Pointer(&m.slots[h]))
}

// prefetchSlots is the table size from which prefetching pays: smaller
// tables (64 KiB of slots) stay in the caches of a busy core.
// prefetchAhead is how many keys ahead of the one looked up removals ask
// for (prefetch, touch).
const (
	prefetchSlots = 1 << 12
	prefetchAhead = 16
)

// get returns the entry for k.
func (m *extMap) get(k kvroute.ExternalHash) (entry, bool) {
	if i := m.find(k); i >= 0 {
		return unpack(m.slotAt(i).val), true
	}
	return entry{}, false
}

// upsert returns the packed entry of k for the caller to read and set, and
// whether k was present; an absent k is inserted with an entry the caller
// must set before the next operation on the map. A new key takes the
// first empty slot of its home group (see upsertAt).
func (m *extMap) upsert(k kvroute.ExternalHash) (*uint64, bool) { return m.upsertAt(k, false) }

// upsertAt is upsert; with home set, a new key whose home slot is empty
// takes it rather than the first empty slot of its group.
//
// The two suit different tables. In a table the caches hold, finding the
// group's first empty slot with word arithmetic costs a few cycles and no
// branch whose outcome depends on the key, while whether the home slot is
// empty is a coin toss in a half-full table, a branch the CPU mispredicts
// half the time. In tables far larger than the caches, the home slot lets
// the CPU issue the slot's store, predicted, without waiting for the
// control word to come from memory.
func (m *extMap) upsertAt(k kvroute.ExternalHash, home bool) (*uint64, bool) {
	x := mix(k, m.seed)
	fp := fingerprint(x)
	n := len(m.slots)
	h := homeSlot(x, m.shift)
	g := h &^ (groupWidth - 1)
	if home {
		if *m.ctrlAt(h) == 0 && matchByte(m.group(g), fp) == 0 && m.room > 0 {
			// A group with an empty slot holds every key whose home it
			// is (take never empties a slot of a group that a key's
			// probe went past), so no match in it means k is absent.
			return m.insertAt(h, k, fp), false
		}
	} else if w := m.group(g); matchByte(w, fp) == 0 && matchEmpty(w) != 0 && m.room > 0 {
		// The same, for the group's first empty slot.
		return m.insertAt(g+bits.TrailingZeros64(matchEmpty(w))>>3, k, fp), false
	}
	free := -1 // the first empty or deleted slot the probe passed
	for {
		w := m.group(g)
		for cand := matchByte(w, fp); cand != 0; cand &= cand - 1 {
			if j := g + bits.TrailingZeros64(cand)>>3; m.slotAt(j).key == k {
				return &m.slotAt(j).val, true
			}
		}
		if free < 0 {
			if f := matchFree(w); f != 0 {
				free = g + bits.TrailingZeros64(f)>>3
			}
		}
		if matchEmpty(w) != 0 {
			break
		}
		if g += groupWidth; g == n {
			g = 0
		}
	}
	if *m.ctrlAt(free) != 0 {
		// Reusing a tombstone, a slot already counted as used.
		m.room++
	} else if m.room <= 0 {
		// Taking an empty slot would fill the table: grow when live keys
		// would fill it, else rebuild it without tombstones.
		if (m.count+1)*maxLoadDen > n*maxLoadNum/2 {
			n *= growth(n)
		}
		m.resize(n)
		return m.upsertAt(k, home)
	}
	return m.insertAt(free, k, fp), false
}

// insertAt stores the new key k with control byte fp in the empty slot j
// and returns its entry for the caller to set.
func (m *extMap) insertAt(j int, k kvroute.ExternalHash, fp uint8) *uint64 {
	*m.ctrlAt(j) = fp
	s := m.slotAt(j)
	s.key = k
	m.room--
	m.count++
	return &s.val
}

// growth is the factor by which a table of n slots grows: four while it
// is small, so that a worker's map reaches its working size in half as
// many rebuilds (a fresh worker's map grows from eight slots to tens of
// thousands), then two, so that a large map never holds more than twice
// the memory its keys need.
func growth(n int) int {
	if n < growFourBelow {
		return 4
	}
	return 2
}

// growFourBelow is the table size below which a table grows fourfold:
// 64 KiB of slots.
const growFourBelow = 1 << 12

// take takes the tiers in mask off k's entry and returns the entry as it
// was, deleting it when no tier is left. It returns false, changing
// nothing, when k is absent or its entry holds none of mask's tiers. It
// is the map's only deletion: the slot becomes empty when another slot of
// its group is empty (the control word the probe read says so), since a
// probe for any key stops at that group anyway; otherwise a probe may
// have passed the full group to a later one, and the slot becomes a
// tombstone.
//
// It repeats find's probe rather than calling a shared one: every block
// an engine evicts comes through here, and the calls a shared probe and
// delete take (neither inlines) cost the LRU trace replay 2.5–3%
// (BenchmarkReplay -replay-gc, 80 alternations).
func (m *extMap) take(k kvroute.ExternalHash, mask uint8) (entry, bool) {
	x := mix(k, m.seed)
	fp := fingerprint(x)
	n := len(m.slots)
	for g := homeSlot(x, m.shift) &^ (groupWidth - 1); ; {
		w := m.group(g)
		for cand := matchByte(w, fp); cand != 0; cand &= cand - 1 {
			j := g + bits.TrailingZeros64(cand)>>3
			s := m.slotAt(j)
			if s.key != k {
				continue
			}
			e := unpack(s.val)
			switch {
			case e.tiers&mask == 0:
				return entry{}, false
			case e.tiers&^mask != 0:
				s.val = entry{id: e.id, pos: e.pos, tiers: e.tiers &^ mask}.pack()
				return e, true
			}
			m.count--
			if matchEmpty(w) != 0 {
				*m.ctrlAt(j) = 0
				m.room++
			} else {
				*m.ctrlAt(j) = ctrlDeleted
			}
			if n > m.floor && m.count*8 < n {
				m.resize(max(n/2, m.floor))
			}
			return e, true
		}
		if matchEmpty(w) != 0 {
			return entry{}, false
		}
		if g += groupWidth; g == n {
			g = 0
		}
	}
}

// resize rehashes the live entries into a table of n slots (a power of
// two, as every table size is: see shiftFor), without
// tombstones. It works on local copies of the map's fields, which the
// stores into the new table would otherwise make the compiler reload for
// every entry.
func (m *extMap) resize(n int) {
	oldCtrl, oldSlots, seed := m.ctrl, m.slots, m.seed
	n = max(extMapMinSlots, n)
	ctrl, slots := make([]uint8, n), make([]extSlot, n)
	m.ctrl, m.slots, m.shift = ctrl, slots, shiftFor(n)
	shift := m.shift
	for i, c := range oldCtrl {
		if c&0x80 == 0 {
			continue // empty or deleted
		}
		s := oldSlots[i]
		g := homeSlot(mix(s.key, seed), shift) &^ (groupWidth - 1)
		for {
			if f := matchFree(binary.LittleEndian.Uint64(ctrl[g : g+groupWidth])); f != 0 {
				j := g + bits.TrailingZeros64(f)>>3
				ctrl[j], slots[j] = c, s
				break
			}
			if g += groupWidth; g == n {
				g = 0
			}
		}
	}
	m.room = loadLimit(n) - m.count
}

// loadLimit returns how many slots of a table of n slots live keys and
// tombstones may fill: maxLoadNum/maxLoadDen of them.
func loadLimit(n int) int { return n * maxLoadNum / maxLoadDen }

// len returns the number of entries.
func (m *extMap) len() int { return m.count }

// all calls fn for every entry, in table order.
func (m *extMap) all(fn func(kvroute.ExternalHash, entry)) {
	for i, c := range m.ctrl {
		if c&0x80 != 0 {
			fn(m.slots[i].key, unpack(m.slots[i].val))
		}
	}
}

// reset empties the map and releases a table larger than its floor.
func (m *extMap) reset() {
	if len(m.slots) > max(1024, m.floor) {
		m.ctrl, m.slots, m.shift = make([]uint8, m.floor), make([]extSlot, m.floor), shiftFor(m.floor)
	} else {
		clear(m.ctrl)
	}
	m.count, m.room = 0, loadLimit(len(m.slots))
}
