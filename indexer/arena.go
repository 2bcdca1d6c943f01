package indexer

import "sync/atomic"

// segRef names a segment from a run's position: its slot in the index's
// segment arena in the high 32 bits and the slot's generation when the
// segment was given out in the low 32 bits. Zero names no segment.
//
// Positions hold references, not pointers, so that runs hold no pointers:
// the garbage collector never scans their arrays, and setting a
// position's segment is a plain store with no write barrier.
type segRef uint64

func (r segRef) slot() uint32 { return uint32(r >> 32) }
func (r segRef) gen() uint32  { return uint32(r) }

// segArena holds the index's segments in pages that never move or go
// away, so that a reader can follow a reference with no lock. A segment is
// freed once no position refers to it, and its slot is given out again;
// freeing raises the slot's generation, so that a reference a reader took
// before no longer matches it: a reader that read the slot's holder words
// while it was being given out again finds the generation changed and
// discards them.
//
// The writer (the index's write lock) allocates and frees; readers call
// at.
type segArena struct {
	// dir is the pages, republished whenever one is added.
	dir   atomic.Pointer[[]*segPage]
	pages []*segPage
	free  []uint32 // freed slots
	next  uint32   // slots given out so far, slot 0 (no segment) included
}

// segPageLen is the number of segments in a page of segPageBytes.
const (
	segPageLen   = 256
	segPageBytes = segPageLen * segmentBytes
)

type segPage [segPageLen]segment

// init readies an empty arena.
func (a *segArena) init() {
	a.next = 1
	a.dir.Store(&[]*segPage{})
}

// at returns the segment in slot. Any goroutine may call it with a slot
// from a reference it read.
func (a *segArena) at(slot uint32) *segment {
	return &(*a.dir.Load())[slot/segPageLen][slot%segPageLen]
}

// alloc returns a segment with no holders and no positions. Writer only.
func (a *segArena) alloc() *segment {
	var slot uint32
	if n := len(a.free); n > 0 {
		slot = a.free[n-1]
		a.free = a.free[:n-1]
	} else {
		slot = a.next
		a.next++
		if int(slot/segPageLen) == len(a.pages) {
			a.pages = append(a.pages, new(segPage))
			dir := a.pages
			publishPointer(&a.dir, &dir)
		}
	}
	s := &a.pages[slot/segPageLen][slot%segPageLen]
	s.slot = slot
	return s
}

// release frees s, to which no live position refers: references to it
// no longer match its slot, and its holder set is emptied (its extra
// chunks dropped) for the next segment given out there. Writer only.
func (a *segArena) release(s *segment) {
	publishUint32(&s.gen, s.gen.Load()+1)
	for t := range s.holder.tiers {
		publishUint64(&s.holder.tiers[t], 0)
	}
	publishPointer(&s.holder.next, nil)
	s.holders, s.count = 0, 0
	a.free = append(a.free, s.slot)
}

// bytes returns the memory of the arena's pages. Any goroutine may call
// it.
func (a *segArena) bytes() int64 { return int64(len(*a.dir.Load())) * segPageBytes }
