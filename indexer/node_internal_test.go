package indexer

import (
	"testing"

	"github.com/kvroute/kvroute"
)

// TestHoldersDifferBeyondFirstChunk: a neighbour with the same holders in
// the first chunk as a segment and no second chunk does not have the
// segment's holders with a worker past the first 64 slots added, though
// neither segment has that worker's chunk; a neighbour with the worker
// does.
func TestHoldersDifferBeyondFirstChunk(t *testing.T) {
	n, s := &segment{}, &segment{}
	n.setTier(1, kvroute.TierDevice)
	s.setTier(1, kvroute.TierDevice)
	for _, slot := range []int{slotsPerChunk, 2*slotsPerChunk + 3} {
		if holdersDiffer(n, s, slot, kvroute.TierDevice, true) {
			t.Errorf("slot %d added: the neighbour without it is taken for the segment with it", slot)
		}
	}
	n.setTier(slotsPerChunk, kvroute.TierDevice)
	if !holdersDiffer(n, s, slotsPerChunk, kvroute.TierDevice, true) {
		t.Error("the neighbour with the worker added is not taken")
	}
}
