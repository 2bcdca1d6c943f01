package indexer

import (
	"math/bits"

	"github.com/kvroute/kvroute"
)

// lookahead is the number of blocks Match looks up before it processes
// them. Eight keeps the wasted lookups past the end of a match small while
// letting most of a batch's cache misses overlap.
const lookahead = 8

// WorkerMatch is how much of a request's prefix one cache domain holds.
type WorkerMatch struct {
	Worker kvroute.WorkerKey
	// Blocks is the number of leading request blocks the worker holds, in
	// any tier.
	Blocks int
	// ByTier splits Blocks by the fastest tier each block is held in; the
	// counts add up to Blocks.
	ByTier [kvroute.NumTiers]int
}

// MatchResult is the answer of Index.Match. It is meant to be reused: a
// caller that keeps one per goroutine matches without allocating once the
// result has grown to the cluster's size. The zero value is ready to use.
type MatchResult struct {
	// StopAtOne makes Match stop as soon as a single worker still holds the
	// prefix: that worker's Blocks is then a lower bound and Truncated is
	// set. Useful when the caller only needs the best worker, not its depth.
	StopAtOne bool

	// Workers lists every worker that holds at least the first block, in
	// no particular order. It is valid until the next Match into this
	// result.
	Workers []WorkerMatch
	// Blocks is the longest prefix any worker holds (the largest Blocks in
	// Workers).
	Blocks int
	// Truncated is set when StopAtOne ended the walk early.
	Truncated bool

	active  []uint64                  // per chunk: slots still matching
	tierCnt [][kvroute.NumTiers]int32 // per slot: blocks counted in tiers above device
	touched []uint64                  // per chunk: slots with tierCnt to reset
}

// Reset empties the result, keeping its storage.
func (r *MatchResult) Reset() {
	r.Workers = r.Workers[:0]
	r.Blocks = 0
	r.Truncated = false
}

// Find returns the match of worker w and whether w holds any of the prefix.
func (r *MatchResult) Find(w kvroute.WorkerKey) (WorkerMatch, bool) {
	for _, m := range r.Workers {
		if m.Worker == w {
			return m, true
		}
	}
	return WorkerMatch{}, false
}

// Match finds, for the request whose chained block hashes are seqs, how
// many leading blocks every worker holds, and writes the answer into res.
//
// It walks the prefix one block at a time, narrowing the set of workers
// that still hold every block so far; it stops at the first block nobody
// in the set holds. Match takes no lock and allocates nothing once res has
// grown to the cluster's size; it may run concurrently with Apply.
func (ix *Index) Match(seqs []kvroute.SeqHash, res *MatchResult) {
	res.Reset()
	if len(seqs) == 0 {
		return
	}
	slots := *ix.slotKeys.Load()
	words := (len(slots) + slotsPerChunk - 1) / slotsPerChunk
	if words == 0 {
		return
	}
	res.grow(words, len(slots))
	active := res.active[:words]

	// Look blocks up a batch ahead: the lookups of a batch are independent,
	// so the CPU overlaps their cache misses instead of paying them one by
	// one, which is what dominates a walk over a large, cold index.
	var batch [lookahead]found
	live := 0
	depth := 0
walk:
	for depth < len(seqs) {
		k := min(lookahead, len(seqs)-depth)
		for j := range k {
			b := &batch[j]
			b.any0, b.dev0, b.n, b.ok = ix.nodes.lookup(seqs[depth+j])
		}
		for j := range k {
			if res.StopAtOne && live == 1 {
				res.Truncated = true
				break walk
			}
			b := &batch[j]
			if !b.ok || b.n.holders.Load() == 0 {
				break walk
			}
			live = 0
			c := b.n.holder.next.Load()
			for w := range active {
				var held uint64
				switch {
				case w == 0:
					held = b.any0
				case c != nil:
					held = c.any()
					c = c.next.Load()
				}
				if depth == 0 {
					active[w] = held
				} else if dropped := active[w] &^ held; dropped != 0 {
					res.finish(slots, w, dropped, depth)
					active[w] &= held
				}
				live += bits.OnesCount64(active[w])
			}
			if live == 0 {
				break walk
			}
			res.countTiers(b, active)
			depth++
		}
	}
	for w := range active {
		if active[w] != 0 {
			res.finish(slots, w, active[w], depth)
			active[w] = 0
		}
	}
	// Clear the per-slot tier counters that this match used.
	for w, t := range res.touched[:words] {
		for t != 0 {
			b := bits.TrailingZeros64(t)
			t &= t - 1
			res.tierCnt[w*slotsPerChunk+b] = [kvroute.NumTiers]int32{}
		}
		res.touched[w] = 0
	}
}

// found is one block looked up by Match.
type found struct {
	any0, dev0 uint64
	n          *node
	ok         bool
}

// grow sizes the scratch space for words chunks and slots slots.
func (r *MatchResult) grow(words, slots int) {
	if len(r.active) < words {
		r.active = make([]uint64, words)
		r.touched = make([]uint64, words)
	}
	if len(r.tierCnt) < words*slotsPerChunk {
		r.tierCnt = make([][kvroute.NumTiers]int32, words*slotsPerChunk)
	}
}

// countTiers counts the current block of every still-active slot that holds
// it only in tiers slower than device. Device blocks are derived at finish
// from the total, which keeps the common all-device walk to a few word ops.
func (r *MatchResult) countTiers(b *found, active []uint64) {
	c := &b.n.holder
	for w := 0; w < len(active) && c != nil; w++ {
		var slow uint64
		if w == 0 {
			slow = active[0] &^ b.dev0
		} else {
			slow = active[w] &^ c.tiers[kvroute.TierDevice].Load()
		}
		if slow != 0 {
			r.touched[w] |= slow
			for t := kvroute.TierHost; t < kvroute.NumTiers && slow != 0; t++ {
				in := slow & c.tiers[t].Load()
				slow &^= in
				for in != 0 {
					b := bits.TrailingZeros64(in)
					in &= in - 1
					r.tierCnt[w*slotsPerChunk+b][t]++
				}
			}
		}
		c = c.next.Load()
	}
}

// finish records the slots in mask of chunk w as holding depth blocks.
func (r *MatchResult) finish(slots []slotKey, w int, mask uint64, depth int) {
	for mask != 0 {
		b := bits.TrailingZeros64(mask)
		mask &= mask - 1
		slot := w*slotsPerChunk + b
		if slot >= len(slots) || !slots[slot].ok {
			continue // the slot was freed while matching
		}
		m := WorkerMatch{Worker: slots[slot].key, Blocks: depth}
		slow := 0
		for t := kvroute.TierHost; t < kvroute.NumTiers; t++ {
			m.ByTier[t] = int(r.tierCnt[slot][t])
			slow += m.ByTier[t]
		}
		m.ByTier[kvroute.TierDevice] = depth - slow
		r.Workers = append(r.Workers, m)
		if depth > r.Blocks {
			r.Blocks = depth
		}
	}
}
