package indexer

import (
	"sync/atomic"
	"unsafe"

	"github.com/kvroute/kvroute"
)

// slotsPerChunk is the number of worker slots one chunk tracks: one bit per
// slot in a 64-bit word per tier.
const slotsPerChunk = 64

// chunk records, for 64 consecutive worker slots, which of them hold the
// blocks of a segment and in which tiers: bit s of tiers[t] is set when
// slot s holds them in tier t. Chunks form a list; a segment embeds its
// first chunk, so clusters of up to 64 cache domains cost 40 bytes per
// segment for the sets.
//
// Readers load the words atomically with no lock; the index's writer
// changes them with atomic stores, and the list only grows.
type chunk struct {
	tiers [kvroute.NumTiers]atomic.Uint64
	next  atomic.Pointer[chunk]
}

// any returns the slots of the chunk that hold the blocks in any tier.
func (c *chunk) any() uint64 {
	return c.tiers[0].Load() | c.tiers[1].Load() | c.tiers[2].Load() | c.tiers[3].Load()
}

// run is a chain of blocks of one path of the prefix tree at fixed
// positions: the block at position i+1 is a child of the block at i, and
// the block at 0 a child of parent. A position is written once, before any
// reader can reach it, and never changes; a block keeps its position for as
// long as anyone holds it. So a reader compares a request's hashes with a
// run's in contiguous memory with no lock, and the engine-hash maps and the
// block table point at (run, position) and are never updated when holders
// change.
//
// Positions appended by a write become visible to readers together, when
// the write ends: pub is the number of positions readers may look at, and
// the writer fills positions at or after it with plain stores (no atomic
// store per block) before raising it.
//
// Who holds a position is its segment: segs[i] refers to the holder set
// of position i (a segRef into the index's segment arena), shared by every
// position with exactly the same holders in the same tiers (typically a
// long stretch), or is zero when nobody holds it (the position is dead; it
// comes back to life when its block is stored again under the same
// parent). A reader walking a run reloads the holder words only where the
// reference changes. The two arrays are one allocation with no
// pointers, which the garbage collector never scans.
type run struct {
	seqs  []kvroute.SeqHash // chained hashes; positions < written are set
	segs  []atomic.Uint64   // segRef of each position
	pub   atomic.Int32      // positions readers may look at
	arena *segArena         // where segs refer

	// Fields below are the writer's, under the index's write lock.
	parent    kvroute.SeqHash // parent of seqs[0]
	hasParent bool
	// up and upPos are where the parent was when the run started. The
	// position's contents never change, so Dump can name every ancestor
	// of a block even when nobody holds them any more.
	up      *run
	upPos   int32
	written int32 // positions written
	live    int32 // positions alive
	id      uint32
}

// segment is the holder set of some positions of a run. Its words change
// in place only when the holders of all its positions change together;
// when only some do, they move to another segment.
//
// A segment whose last holder leaves all its positions at once dies with
// them: its positions refer to no segment any more, and it is freed. So is
// a segment none of whose positions refer to it any more. A freed
// segment's arena slot is given out again (see segArena); a position
// comes back to life with a new segment.
type segment struct {
	holder  chunk // slots 0-63; later chunks for more slots
	holders int32 // slots holding it in any tier; the writer's
	count   int32 // positions referring to it; the writer's
	// gen is the generation of the arena slot the segment is in, raised
	// when the segment is freed; slot is that slot (the writer's).
	gen  atomic.Uint32
	slot uint32
	_    [segmentBytes - 56]byte // a cache line each in the arena
}

// A segment takes segmentBytes, a cache line, in the arena: these fail to
// compile otherwise.
var (
	_ [segmentBytes - unsafe.Sizeof(segment{})]struct{}
	_ [unsafe.Sizeof(segment{}) - segmentBytes]struct{}
)

// ref returns the reference to s, as positions hold it: zero for nil.
func (s *segment) ref() uint64 {
	if s == nil {
		return 0
	}
	return uint64(s.slot)<<32 | uint64(s.gen.Load())
}

// newRun returns a run with room for capacity blocks whose first block's
// parent is parent (none when hasParent is false).
func newRun(capacity int, parent kvroute.SeqHash, hasParent bool, arena *segArena) *run {
	buf := make([]uint64, 2*capacity)
	r := &run{parent: parent, hasParent: hasParent, arena: arena}
	r.seqs = unsafe.Slice((*kvroute.SeqHash)(unsafe.Pointer(&buf[0])), capacity)
	r.segs = unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(&buf[capacity])), capacity)
	return r
}

// segAt returns the segment the reference w names, nil when w names none
// or a segment freed since (its generation moved on).
func (a *segArena) segAt(w uint64) *segment {
	if w == 0 {
		return nil
	}
	s := a.at(segRef(w).slot())
	if s.gen.Load() != segRef(w).gen() {
		return nil
	}
	return s
}

// parentPlace returns the place of the parent of the block at position
// i, and false at the root.
func (r *run) parentPlace(i int) (*run, int, bool) {
	if i > 0 {
		return r, i - 1, true
	}
	return r.up, int(r.upPos), r.up != nil
}

// parentOf returns the parent of the block at position i.
func (r *run) parentOf(i int) (kvroute.SeqHash, bool) {
	if i > 0 {
		return r.seqs[i-1], true
	}
	return r.parent, r.hasParent
}

// seg returns the segment of position i, nil when it is dead or out of
// the run. It is the writer's view.
func (r *run) seg(i int) *segment {
	if i < 0 || i >= len(r.segs) {
		return nil
	}
	if s := r.arena.segAt(r.segs[i].Load()); s.live() {
		return s
	}
	return nil
}

// live reports whether s is a segment someone holds: not nil and not
// dead. It is the writer's view.
func (s *segment) live() bool { return s != nil && s.holders > 0 }

// sameSeg reports whether position i refers to s, a live segment, so
// that i is alive in s. Unlike seg it reads nothing of i's segment.
func (r *run) sameSeg(i int, s *segment) bool {
	return i >= 0 && i < len(r.segs) && r.segs[i].Load() == s.ref()
}

// liveNeighbour returns the segment of position i when it is live and
// not s, else nil. It reads the segment only when it is not s.
func (r *run) liveNeighbour(i int, s *segment) *segment {
	if i < 0 || i >= len(r.segs) {
		return nil
	}
	if nb := r.arena.segAt(r.segs[i].Load()); nb != s && nb.live() {
		return nb
	}
	return nil
}

// setSeg sets the segment of position i, with a release store for the
// readers (see publishPointer).
func (r *run) setSeg(i int, s *segment) {
	publishUint64(&r.segs[i], s.ref())
}

// alive reports whether someone holds position i.
func (r *run) alive(i int) bool { return r.seg(i) != nil }

// chunkFor returns the chunk for slot, or nil when the segment has none.
func (s *segment) chunkFor(slot int) *chunk {
	c := &s.holder
	for i := slot / slotsPerChunk; i > 0 && c != nil; i-- {
		c = c.next.Load()
	}
	return c
}

// growChunkFor returns the chunk for slot, appending chunks as needed, and
// the number it appended.
func (s *segment) growChunkFor(slot int) (*chunk, int) {
	c, added := &s.holder, 0
	for i := slot / slotsPerChunk; i > 0; i-- {
		next := c.next.Load()
		if next == nil {
			next = new(chunk)
			publishPointer(&c.next, next)
			added++
		}
		c = next
	}
	return c, added
}

// tiersOf returns the tiers in which slot holds the segment, as a bit set.
func (s *segment) tiersOf(slot int) uint8 {
	c := s.chunkFor(slot)
	if c == nil {
		return 0
	}
	bit := uint64(1) << (slot % slotsPerChunk)
	var t uint8
	for i := range c.tiers {
		if c.tiers[i].Load()&bit != 0 {
			t |= 1 << i
		}
	}
	return t
}

// heldOnlyBy reports whether slot, in tier t only, is the sole holder.
func (s *segment) heldOnlyBy(slot int, t kvroute.Tier) bool {
	return s.holders == 1 && s.tiersOf(slot) == 1<<t
}

// copyHolders gives s the holders of m and returns the number of chunks it
// appended. s holds nothing yet.
func (s *segment) copyHolders(m *segment) int {
	added := 0
	dst := &s.holder
	for src := &m.holder; src != nil; src = src.next.Load() {
		for t := range kvroute.NumTiers {
			publishUint64(&dst.tiers[t], src.tiers[t].Load())
		}
		if src.next.Load() != nil {
			fresh := new(chunk)
			publishPointer(&dst.next, fresh)
			dst = fresh
			added++
		}
	}
	s.holders = m.holders
	return added
}

// setTier sets slot's bit for tier t and reports whether slot held the
// segment in no tier before, and the chunks it appended.
func (s *segment) setTier(slot int, t kvroute.Tier) (newHolder bool, added int) {
	c, added := s.growChunkFor(slot)
	bit := uint64(1) << (slot % slotsPerChunk)
	w := c.tiers[t].Load()
	if w&bit != 0 {
		return false, added
	}
	newHolder = c.any()&bit == 0
	publishUint64(&c.tiers[t], w|bit)
	if newHolder {
		s.holders++
	}
	return newHolder, added
}

// clearTier clears slot's bit for tier t and reports whether slot now
// holds the segment in no tier.
func (s *segment) clearTier(slot int, t kvroute.Tier) (gone bool) {
	c := s.chunkFor(slot)
	if c == nil {
		return false
	}
	bit := uint64(1) << (slot % slotsPerChunk)
	w := c.tiers[t].Load()
	if w&bit == 0 {
		return false
	}
	publishUint64(&c.tiers[t], w&^bit)
	gone = c.any()&bit == 0
	if gone {
		s.holders--
	}
	return gone
}

// extraChunks returns the number of chunks after the embedded one.
func (s *segment) extraChunks() int {
	k := 0
	for c := s.holder.next.Load(); c != nil; c = c.next.Load() {
		k++
	}
	return k
}
