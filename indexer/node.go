package indexer

import (
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/kvroute/kvroute"
)

// slotsPerChunk is the number of worker slots one chunk tracks: one bit per
// slot in a 64-bit word per tier.
const slotsPerChunk = 64

// chunk records, for 64 consecutive worker slots, which of them hold the
// blocks of a node and in which tiers: bit s of tiers[t] is set when slot s
// holds them in tier t. Chunks form a list; a node embeds its first chunk,
// so clusters of up to 64 cache domains cost 40 bytes per node for the
// sets.
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

// node is a run of consecutive blocks of one path of the prefix tree (each
// block's parent is the block before it) that exactly the same workers hold
// in exactly the same tiers. A request walks a run by comparing its
// sequence hashes with the run's, in contiguous memory, after one table
// lookup for the run's first block.
//
// The run lives in positions [lo, hi) of fixed arrays. A position is
// written once, before hi is raised over it, and never again: splitting a
// run moves the blocks on one side to a new node and then narrows the
// window, and appending happens only at the never-written end. So a reader
// that loads the window and then reads positions inside it reads stable
// values, whatever the writer does meanwhile; readers load the holder
// words before the window (see Index.Match).
type node struct {
	seqs   []kvroute.SeqHash   // chained hashes; positions < written are set
	locals []kvroute.BlockHash // the blocks' own hashes, for Dump

	lo, hi atomic.Int32 // the live window

	holder chunk // slots 0-63; later chunks for more slots

	// Fields below are the writer's, under the index's write lock.
	parent    kvroute.SeqHash // parent of seqs[0]
	hasParent bool
	written   int32 // positions written; appending needs written == hi
	holders   int32 // slots holding the run in any tier
}

// newNode returns a node with room for capacity blocks whose first block's
// parent is parent (none when hasParent is false), holding nothing.
func newNode(capacity int, parent kvroute.SeqHash, hasParent bool) *node {
	buf := make([]uint64, 2*capacity)
	n := &node{parent: parent, hasParent: hasParent}
	n.seqs = seqSlice(buf[:capacity:capacity])
	n.locals = blockSlice(buf[capacity:])
	return n
}

// seqSlice and blockSlice view one allocation as the two arrays of a node.
func seqSlice(b []uint64) []kvroute.SeqHash {
	return unsafe.Slice((*kvroute.SeqHash)(unsafe.Pointer(unsafe.SliceData(b))), len(b))
}

func blockSlice(b []uint64) []kvroute.BlockHash {
	return unsafe.Slice((*kvroute.BlockHash)(unsafe.Pointer(unsafe.SliceData(b))), len(b))
}

// window returns the live window, for the writer.
func (n *node) window() (lo, hi int) { return int(n.lo.Load()), int(n.hi.Load()) }

// size returns the number of live blocks.
func (n *node) size() int { lo, hi := n.window(); return hi - lo }

// parentOf returns the parent of the block at position i.
func (n *node) parentOf(i int) (kvroute.SeqHash, bool) {
	if i > 0 {
		return n.seqs[i-1], true
	}
	return n.parent, n.hasParent
}

// chunkFor returns the chunk for slot, or nil when the node has none yet.
func (n *node) chunkFor(slot int) *chunk {
	c := &n.holder
	for i := slot / slotsPerChunk; i > 0 && c != nil; i-- {
		c = c.next.Load()
	}
	return c
}

// growChunkFor returns the chunk for slot, appending chunks as needed, and
// the number it appended.
func (n *node) growChunkFor(slot int) (*chunk, int) {
	c, added := &n.holder, 0
	for i := slot / slotsPerChunk; i > 0; i-- {
		next := c.next.Load()
		if next == nil {
			next = new(chunk)
			c.next.Store(next)
			added++
		}
		c = next
	}
	return c, added
}

// tiersOf returns the tiers in which slot holds the run, as a bit set.
func (n *node) tiersOf(slot int) uint8 {
	c := n.chunkFor(slot)
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

// heldOnlyBy reports whether slot, in tier t only, is the run's sole holder.
func (n *node) heldOnlyBy(slot int, t kvroute.Tier) bool {
	return n.holders == 1 && n.tiersOf(slot) == 1<<t
}

// sameHolders reports whether n and m have the same holders in the same
// tiers.
func (n *node) sameHolders(m *node) bool {
	if n.holders != m.holders {
		return false
	}
	a, b := &n.holder, &m.holder
	for a != nil || b != nil {
		var x, y *chunk
		if a != nil {
			x, a = a, a.next.Load()
		}
		if b != nil {
			y, b = b, b.next.Load()
		}
		for t := range kvroute.NumTiers {
			var xv, yv uint64
			if x != nil {
				xv = x.tiers[t].Load()
			}
			if y != nil {
				yv = y.tiers[t].Load()
			}
			if xv != yv {
				return false
			}
		}
	}
	return true
}

// copyHolders gives n the holders of m, and returns the number of chunks it
// appended. n holds nothing yet.
func (n *node) copyHolders(m *node) int {
	added := 0
	dst := &n.holder
	for src := &m.holder; src != nil; src = src.next.Load() {
		for t := range kvroute.NumTiers {
			dst.tiers[t].Store(src.tiers[t].Load())
		}
		if next := src.next.Load(); next != nil {
			fresh := new(chunk)
			dst.next.Store(fresh)
			dst = fresh
			added++
		}
	}
	n.holders = m.holders
	return added
}

// setTier sets slot's bit for tier t and reports whether it changed and
// whether slot held the run in no tier before. It returns the chunks it
// appended.
func (n *node) setTier(slot int, t kvroute.Tier) (changed, newHolder bool, added int) {
	c, added := n.growChunkFor(slot)
	bit := uint64(1) << (slot % slotsPerChunk)
	w := c.tiers[t].Load()
	if w&bit != 0 {
		return false, false, added
	}
	newHolder = c.any()&bit == 0
	c.tiers[t].Store(w | bit)
	if newHolder {
		n.holders++
	}
	return true, newHolder, added
}

// clearTier clears slot's bit for tier t and reports whether it changed
// and whether slot now holds the run in no tier.
func (n *node) clearTier(slot int, t kvroute.Tier) (changed, gone bool) {
	c := n.chunkFor(slot)
	if c == nil {
		return false, false
	}
	bit := uint64(1) << (slot % slotsPerChunk)
	w := c.tiers[t].Load()
	if w&bit == 0 {
		return false, false
	}
	c.tiers[t].Store(w &^ bit)
	gone = c.any()&bit == 0
	if gone {
		n.holders--
	}
	return true, gone
}

// slotsHolding appends the slots that hold the run in any tier.
func (n *node) slotsHolding(dst []int) []int {
	base := 0
	for c := &n.holder; c != nil; c = c.next.Load() {
		for a := c.any(); a != 0; a &= a - 1 {
			dst = append(dst, base+bits.TrailingZeros64(a))
		}
		base += slotsPerChunk
	}
	return dst
}

// extraChunks returns the number of chunks after the embedded one.
func (n *node) extraChunks() int {
	k := 0
	for c := n.holder.next.Load(); c != nil; c = c.next.Load() {
		k++
	}
	return k
}
