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
// at two positions, a segment whose holder or position count is not what
// points at it, or block and pair totals that are not ix's.
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
	for s, n := range positions {
		if s.count != n {
			return nil, 0, fmt.Errorf("a segment counts %d positions, %d point at it", s.count, n)
		}
	}
	if int64(len(live)) != ix.sz.blocks {
		return nil, 0, fmt.Errorf("%d blocks live, the index counts %d", len(live), ix.sz.blocks)
	}
	if int64(pairs) != ix.sz.pairs {
		return nil, 0, fmt.Errorf("%d (block, worker) pairs held, the index counts %d", pairs, ix.sz.pairs)
	}
	return held, pairs, nil
}
