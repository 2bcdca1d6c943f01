package indexer

import (
	"fmt"
	"math/bits"

	"github.com/kvroute/kvroute"
)

// SetSweepMin lowers the number of dead run positions from which ix sweeps
// dead run starts from its table, so that tests reach sweeps with small
// indexes.
func SetSweepMin(ix *Index, n int) { ix.sweepMin = n }

// HeldBlocks walks every position of every run of ix and returns, per
// worker, the tiers (bit t for tier t) in which it holds each block, as
// read from the holder bits of the positions' segments: the sets Match
// sees, not the workers' engine-hash maps. It also returns the number of
// (block, worker) pairs those bits make. It returns an error when the bits
// disagree with what ix counts: a bit for a slot nobody has, a block live
// at two positions, a position that refers to a freed or dead segment, a
// segment whose holder or position count is not what points at it or
// whose arena slot is free, or segment, block and pair totals that are
// not ix's.
func HeldBlocks(ix *Index) (map[kvroute.WorkerKey]map[kvroute.SeqHash]uint8, int, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	keys := *ix.slotKeys.Load()
	held := map[kvroute.WorkerKey]map[kvroute.SeqHash]uint8{}
	live := map[kvroute.SeqHash]bool{}
	positions := map[*segment]int32{}
	pairs := 0
	for id, r := range ix.runs {
		if r == nil {
			continue
		}
		for pos := range int(r.written) {
			if w := r.segs[pos].Load(); w != 0 && !r.arena.segAt(w).live() {
				return nil, 0, fmt.Errorf("run %d position %d refers to a freed or dead segment", id, pos)
			}
			s := r.seg(pos)
			if s == nil {
				continue
			}
			seq := r.seqs[pos]
			if live[seq] {
				return nil, 0, fmt.Errorf("block %#x is live at two positions (run %d position %d too)", uint64(seq), id, pos)
			}
			live[seq] = true
			positions[s]++
			holders := int32(0)
			slot := 0
			for c := &s.holder; c != nil; c, slot = c.next.Load(), slot+slotsPerChunk {
				for any := c.any(); any != 0; any &= any - 1 {
					sl := slot + bits.TrailingZeros64(any)
					if sl >= len(keys) || !keys[sl].ok {
						return nil, 0, fmt.Errorf("block %#x (run %d position %d) is held by slot %d, which no worker has", uint64(seq), id, pos, sl)
					}
					tiers := s.tiersOf(sl)
					w := keys[sl].key
					if held[w] == nil {
						held[w] = map[kvroute.SeqHash]uint8{}
					}
					held[w][seq] = tiers
					holders++
					pairs++
				}
			}
			if holders != s.holders {
				return nil, 0, fmt.Errorf("block %#x (run %d position %d): its segment counts %d holders, its bits %d", uint64(seq), id, pos, s.holders, holders)
			}
			if holders == 0 {
				return nil, 0, fmt.Errorf("block %#x (run %d position %d) is live with no holder", uint64(seq), id, pos)
			}
		}
	}
	freed := map[uint32]bool{}
	for _, slot := range ix.arena.free {
		if freed[slot] {
			return nil, 0, fmt.Errorf("arena slot %d is free twice", slot)
		}
		freed[slot] = true
	}
	for s, n := range positions {
		if s.count != n {
			return nil, 0, fmt.Errorf("a segment counts %d positions, %d point at it", s.count, n)
		}
		if freed[s.slot] {
			return nil, 0, fmt.Errorf("a segment that positions refer to is in a free arena slot")
		}
	}
	if int64(len(positions)) != ix.sz.segs {
		return nil, 0, fmt.Errorf("%d segments live, the index counts %d", len(positions), ix.sz.segs)
	}
	if int64(len(live)) != ix.sz.blocks {
		return nil, 0, fmt.Errorf("%d blocks live, the index counts %d", len(live), ix.sz.blocks)
	}
	if int64(pairs) != ix.sz.pairs {
		return nil, 0, fmt.Errorf("%d (block, worker) pairs held, the index counts %d", pairs, ix.sz.pairs)
	}
	return held, pairs, nil
}

// EntryOf is one engine hash a worker holds: its block and tiers.
type EntryOf struct {
	Seq   kvroute.SeqHash
	Tiers uint8
}

// WorkerEntries returns the engine-hash map of worker w: every engine hash
// it holds, with the block it names and its tiers.
func WorkerEntries(ix *Index, w kvroute.WorkerKey) map[kvroute.ExternalHash]EntryOf {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ws := ix.worker(w, false)
	if ws == nil {
		return nil
	}
	out := map[kvroute.ExternalHash]EntryOf{}
	ws.blocks.all(func(ext kvroute.ExternalHash, e entry) {
		out[ext] = EntryOf{Seq: ix.seqOf(e), Tiers: e.tiers}
	})
	return out
}

// Recount recounts what ix holds from its structures (live runs, their
// memory, live segments and their extra chunks, engine-hash entries,
// duplicate engine hashes) and returns an error when a size counter
// disagrees, is negative, or was not published.
func Recount(ix *Index) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var want sizes
	segs := map[*segment]bool{}
	for id, r := range ix.runs {
		if r == nil {
			continue
		}
		if r.live == 0 || int(r.id) != id {
			return fmt.Errorf("run %d (id %d) is registered with %d live positions", id, r.id, r.live)
		}
		want.runs++
		want.runBytes += runHeaderBytes + runPosBytes*int64(len(r.seqs))
		live := int32(0)
		for pos := range int(r.written) {
			if s := r.seg(pos); s != nil {
				live++
				want.blocks++
				if !segs[s] {
					segs[s] = true
					want.segs++
					want.chunks += int64(s.extraChunks())
				}
			}
		}
		if live != r.live {
			return fmt.Errorf("run %d has %d live positions, counts %d", id, live, r.live)
		}
	}
	free := map[uint32]bool{}
	for _, id := range ix.freeRuns {
		if free[id] || int(id) >= len(ix.runs) || ix.runs[id] != nil {
			return fmt.Errorf("free run id %d is taken or listed twice", id)
		}
		free[id] = true
	}
	var dupErr error
	ix.workers.Range(func(_ kvroute.WorkerKey, ws *workerState) bool {
		want.entries += int64(ws.blocks.len())
		// A worker's duplicates are its engine hashes beyond the first
		// for each (block, tier).
		per := map[dupKey]int{}
		ws.blocks.all(func(_ kvroute.ExternalHash, e entry) {
			for t := kvroute.Tier(0); t < kvroute.NumTiers; t++ {
				if e.tiers&(1<<t) != 0 {
					per[dupKey{ix.seqOf(e), t}]++
				}
			}
		})
		for k, n := range per {
			if ws.dups[k] != n-1 {
				dupErr = fmt.Errorf("worker %v holds %#x in tier %d under %d engine hashes, counts %d duplicates", ws.key, uint64(k.seq), k.tier, n, ws.dups[k])
				return false
			}
		}
		for k, n := range ws.dups {
			if per[k] == 0 && n != 0 {
				dupErr = fmt.Errorf("worker %v counts %d duplicates of %#x in tier %d, which it does not hold", ws.key, n, uint64(k.seq), k.tier)
				return false
			}
		}
		return true
	})
	if dupErr != nil {
		return dupErr
	}
	want.pairs = ix.sz.pairs // HeldBlocks recounts pairs
	if ix.sz != want {
		return fmt.Errorf("index counts %+v, its structures make %+v", ix.sz, want)
	}
	if ix.pub.last != ix.sz {
		return fmt.Errorf("published sizes %+v, counted %+v", ix.pub.last, ix.sz)
	}
	return nil
}
