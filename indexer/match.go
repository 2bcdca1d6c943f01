package indexer

import (
	"math/bits"
	"slices"

	"github.com/kvroute/kvroute"
)

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

	active []uint64 // per chunk: slots still matching
	held   []uint64 // per chunk: slots holding the current stretch
	dev    []uint64 // per chunk: slots holding it on the device
	// slow holds, per chunk, the slots holding the current stretch in
	// each tier; it is set only for chunks where some slot holds it in a
	// tier slower than device (held differs from dev).
	slow    [][kvroute.NumTiers]uint64
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
// It walks the prefix a run at a time: one table lookup finds the run that
// holds the next block, and the request's hashes are compared with the
// run's in contiguous memory, narrowing the set of workers that still hold
// every block so far; it stops at the first block nobody in the set holds.
// Match takes no lock and allocates nothing once res has grown to the
// cluster's size; it may run concurrently with Apply.
//
// A worker removed while Match runs may see its slot given to a new
// worker: the holder bits Match read would then be the new worker's.
// Match walks again when the workers changed while it walked (a bounded
// number of times, then it leaves out the workers whose slots changed
// hands), so that it never names a worker with blocks it never held.
func (ix *Index) Match(seqs []kvroute.SeqHash, res *MatchResult) {
	for attempt := 0; ; attempt++ {
		start := ix.slotKeys.Load()
		ix.match(seqs, res, *start)
		end := ix.slotKeys.Load()
		if end == start {
			return
		}
		if attempt == maxSlotChanges {
			res.keepSameSlots(*start, *end)
			return
		}
	}
}

// maxSlotChanges is how many times Match walks again when the workers
// change while it walks.
const maxSlotChanges = 2

// keepSameSlots leaves out of r the workers whose slot in slots, the
// table a walk named them from, holds another worker (or none) in now.
func (r *MatchResult) keepSameSlots(slots, now []slotKey) {
	r.Workers = slices.DeleteFunc(r.Workers, func(m WorkerMatch) bool {
		for i, k := range slots {
			if k.ok && k.key == m.Worker {
				return i >= len(now) || now[i] != k
			}
		}
		return true
	})
	r.Blocks = 0
	for _, m := range r.Workers {
		r.Blocks = max(r.Blocks, m.Blocks)
	}
}

// match is Match naming workers from slots.
func (ix *Index) match(seqs []kvroute.SeqHash, res *MatchResult, slots []slotKey) {
	res.Reset()
	if len(seqs) == 0 {
		return
	}
	words := (len(slots) + slotsPerChunk - 1) / slotsPerChunk
	if words == 0 {
		return
	}
	res.grow(words, len(slots))
	active, held, dev, slow := res.active[:words], res.held[:words], res.dev[:words], res.slow[:words]

	depth := 0
	first := true
	var cur uint64 // the reference whose holders are in held, dev and slow
	stretch := 0   // blocks counted under cur but not yet by tier
	live := 0
	r, pos, ok := ix.blocks.read(seqs[0])
	for stuck := 0; ok && stuck <= maxStuck; stuck++ {
		from := depth
		n := int(r.pub.Load())
		if pos >= n {
			break // a run start not yet published: nobody holds the block yet
		}
		// Walk the run from pos while it holds the request's blocks, a
		// stretch of one segment at a time.
		for pos < n && depth < len(seqs) {
			s := r.segs[pos].Load()
			if s == 0 {
				if depth == from {
					// The table names a dead run start: nobody holds
					// the block.
					ok = false
				}
				break
			}
			if s != cur {
				if res.StopAtOne && live == 1 {
					res.Truncated = true
					ok = false
					break
				}
				if stretch > 0 {
					res.countTiers(active, dev, slow, stretch)
					stretch = 0
				}
				// held, dev and slow are about to hold s's words: cur is
				// set again once s is taken.
				cur = 0
				seg := ix.arena.at(segRef(s).slot())
				if !loadHolders(seg, held, dev, slow) || seg.gen.Load() != segRef(s).gen() {
					if r.segs[pos].Load() == s && depth == from {
						// A dead segment (it holds nothing, or was
						// freed, and the position still refers to it)
						// at the table's run start: nobody holds the
						// block.
						ok = false
					}
					break
				}
				if r.segs[pos].Load() != s {
					break // the position moved to another segment: look again
				}
			}
			// The stretch of positions in segment s, then how much of it
			// the request follows. A live position was written before its
			// segment was set, so its hash can be read once the segment is
			// seen.
			segs := r.segs[pos:min(n, pos+len(seqs)-depth)]
			e := 1
			for e < len(segs) && segs[e].Load() == s {
				e++
			}
			run, q := r.seqs[pos:pos+e], seqs[depth:depth+e]
			k := 0
			for k < len(run) && run[k] == q[k] {
				k++
			}
			if k == 0 {
				break
			}
			if s != cur {
				cur = s
				live = 0
				for w := range active {
					if first {
						active[w] = held[w]
					} else if dropped := active[w] &^ held[w]; dropped != 0 {
						res.finish(slots, w, dropped, depth)
						active[w] &= held[w]
					}
					live += bits.OnesCount64(active[w])
				}
				first = false
				if live == 0 {
					ok = false
					break
				}
			}
			stretch += k
			depth += k
			pos += k
			if k < e {
				break // the request leaves the run here
			}
		}
		if !ok || depth == len(seqs) {
			break
		}
		if depth > from {
			stuck = 0
		}
		// The request leaves the run here: its next block, if anyone
		// holds it, heads another run.
		r, pos, ok = ix.blocks.read(seqs[depth])
	}
	if stretch > 0 {
		res.countTiers(active, dev, slow, stretch)
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

// maxStuck bounds the table lookups in a row that find nothing to follow
// (a block moving between segments under the walk); past it, the walk
// ends there.
const maxStuck = 16

// loadHolders loads the holder words of s into held (any tier) and dev
// (device), one word per chunk, and into slow the words of every tier of
// the chunks where some slot holds s in a slower tier only; it reports
// whether s holds anything.
func loadHolders(s *segment, held, dev []uint64, slow [][kvroute.NumTiers]uint64) bool {
	c := &s.holder
	any := uint64(0)
	for w := range held {
		if c == nil {
			held[w], dev[w] = 0, 0
			continue
		}
		d := c.tiers[kvroute.TierDevice].Load()
		t1, t2, t3 := c.tiers[1].Load(), c.tiers[2].Load(), c.tiers[3].Load()
		if t1|t2|t3 != 0 {
			slow[w] = [kvroute.NumTiers]uint64{d, t1, t2, t3}
		}
		dev[w] = d
		held[w] = d | t1 | t2 | t3
		any |= held[w]
		c = c.next.Load()
	}
	return any != 0
}

// grow sizes the scratch space for words chunks and slots slots.
func (r *MatchResult) grow(words, slots int) {
	if len(r.active) < words {
		r.active = make([]uint64, words)
		r.held = make([]uint64, words)
		r.dev = make([]uint64, words)
		r.slow = make([][kvroute.NumTiers]uint64, words)
		r.touched = make([]uint64, words)
	}
	if len(r.tierCnt) < words*slotsPerChunk {
		r.tierCnt = make([][kvroute.NumTiers]int32, words*slotsPerChunk)
	}
}

// countTiers counts the run of blocks for every still-active slot that
// holds it only in tiers slower than device, from the holder words
// loadHolders left in dev and tiers. Device blocks are derived at finish
// from the total, which keeps the common all-device walk to a few word
// operations.
func (r *MatchResult) countTiers(active, dev []uint64, tiers [][kvroute.NumTiers]uint64, run int) {
	for w := range active {
		if slow := active[w] &^ dev[w]; slow != 0 {
			r.touched[w] |= slow
			for t := kvroute.TierHost; t < kvroute.NumTiers && slow != 0; t++ {
				in := slow & tiers[w][t]
				slow &^= in
				for in != 0 {
					b := bits.TrailingZeros64(in)
					in &= in - 1
					r.tierCnt[w*slotsPerChunk+b][t] += int32(run)
				}
			}
		}
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
		if r.touched[w]&(1<<b) != 0 {
			for t := kvroute.TierHost; t < kvroute.NumTiers; t++ {
				m.ByTier[t] = int(r.tierCnt[slot][t])
				slow += m.ByTier[t]
			}
		}
		m.ByTier[kvroute.TierDevice] = depth - slow
		r.Workers = append(r.Workers, m)
		if depth > r.Blocks {
			r.Blocks = depth
		}
	}
}
