package indexer

import (
	"sync/atomic"

	"github.com/kvroute/kvroute"
)

// slotsPerChunk is the number of worker slots one chunk tracks: one bit per
// slot in a 64-bit word per tier.
const slotsPerChunk = 64

// chunk records, for 64 consecutive worker slots, which of them hold a
// block and in which tiers: bit s of tiers[t] is set when slot s holds the
// block in tier t. Chunks form a list; a node embeds its first chunk, so
// clusters of up to 64 cache domains cost 40 bytes per block for the sets.
//
// Readers load the words atomically with no lock. Each worker changes only
// its own bits (atomic OR and AND), and the list only grows.
type chunk struct {
	tiers [kvroute.NumTiers]atomic.Uint64
	next  atomic.Pointer[chunk]
}

// any returns the slots of the chunk that hold the block in any tier.
func (c *chunk) any() uint64 {
	return c.tiers[0].Load() | c.tiers[1].Load() | c.tiers[2].Load() | c.tiers[3].Load()
}

// node is one block of the prefix tree: a token prefix named by its chained
// sequence hash, with the set of worker slots that hold it.
type node struct {
	seq    kvroute.SeqHash
	local  kvroute.BlockHash
	parent *node // nil at the root; may outlive its place in the map
	depth  uint32
	// holders counts the worker slots holding the block in any tier; the
	// node is empty (kept for reuse until swept) at zero.
	holders atomic.Int32
	holder  chunk
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
// the number it appended. Workers may grow a node concurrently: a chunk is
// appended with a compare-and-swap, and the loser uses the winner's.
func (n *node) growChunkFor(slot int) (*chunk, int) {
	c, added := &n.holder, 0
	for i := slot / slotsPerChunk; i > 0; i-- {
		next := c.next.Load()
		if next == nil {
			if fresh := new(chunk); c.next.CompareAndSwap(nil, fresh) {
				added++
			}
			next = c.next.Load()
		}
		c = next
	}
	return c, added
}

// has reports whether slot holds the block in tier t.
func (n *node) has(slot int, t kvroute.Tier) bool {
	c := n.chunkFor(slot)
	return c != nil && c.tiers[t].Load()&(1<<(slot%slotsPerChunk)) != 0
}

// heldBy reports whether slot holds the block in any tier.
func (n *node) heldBy(slot int) bool {
	c := n.chunkFor(slot)
	return c != nil && c.any()&(1<<(slot%slotsPerChunk)) != 0
}

// empty reports whether no slot holds the block.
func (n *node) empty() bool {
	for c := &n.holder; c != nil; c = c.next.Load() {
		if c.any() != 0 {
			return false
		}
	}
	return true
}

// chunks returns the number of chunks after the embedded one.
func (n *node) extraChunks() int {
	k := 0
	for c := n.holder.next.Load(); c != nil; c = c.next.Load() {
		k++
	}
	return k
}
