package scheduling_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

// A request's own weight overrides, however large, never take it past the
// load bound: candidates over it still cost more than any within it.
func TestBoundedLoadHoldsAgainstOverrides(t *testing.T) {
	cost, err := scheduling.NewDefaultCost(16)
	require.NoError(t, err)
	sel, err := scheduling.NewSelector(scheduling.SelectorConfig{Seed: 1})
	require.NoError(t, err)
	for _, scale := range []float64{16, 1e10, 1e14, 1e300} {
		req := scheduling.Request{PromptTokens: 1600, Blocks: 100, BlockSize: 16,
			Overrides: scheduling.Overrides{PrefillLoadScale: scheduling.Float(scale)}}
		cands := []scheduling.Candidate{
			{Worker: kvroute.WorkerKey{ID: 1}, Cached: [kvroute.NumTiers]int{100}, Load: scheduling.Load{ActiveRequests: 10}},
			{Worker: kvroute.WorkerKey{ID: 2}}, {Worker: kvroute.WorkerKey{ID: 3}},
		}
		costs := make([]float64, len(cands))
		i, err := scheduling.Choose(cost, sel, &req, cands, costs)
		require.NoError(t, err)
		require.NotEqual(t, 0, i, "scale %g: chose the candidate over the bound; costs %v", scale, costs)
		cost.Costs(&req, cands, costs)
		require.Greater(t, costs[0], max(costs[1], costs[2]), "scale %g: the generic path agrees", scale)
	}
}

// A factor too large for an int bounds nothing, as a large factor does.
func TestBoundedLoadHugeFactor(t *testing.T) {
	inner := scheduling.CostFuncFunc(func(_ *scheduling.Request, cands []scheduling.Candidate, costs []float64) {
		for i := range cands {
			costs[i] = float64(i)
		}
	})
	b, err := scheduling.NewBoundedLoad(inner, scheduling.BoundedLoadConfig{Factor: 1e19})
	require.NoError(t, err)
	cands := []scheduling.Candidate{{Load: scheduling.Load{ActiveRequests: 1}}, {}}
	costs := make([]float64, 2)
	b.Costs(&scheduling.Request{PromptTokens: 16, Blocks: 1}, cands, costs)
	require.Equal(t, []float64{0, 1}, costs)
}

// Softmax with weights that are not numbers (a temperature that
// underflows the scale, a spread of costs that overflows it) picks among
// the cheapest, as temperature 0 does.
func TestSelectorSoftmaxLimits(t *testing.T) {
	sel, err := scheduling.NewSelector(scheduling.SelectorConfig{Seed: 7})
	require.NoError(t, err)
	picks := map[int]int{}
	for range 200 {
		picks[sel.Select([]float64{0, 0, 1}, scheduling.Float(1e-310))]++
	}
	require.Zero(t, picks[2])
	require.Positive(t, picks[0])
	require.Positive(t, picks[1])
	for range 50 {
		require.Equal(t, 0, sel.Select([]float64{-1e308, 1e308}, scheduling.Float(1)))
	}
}

// A TTL too long to add to the clock means never, not at once.
func TestTrackerHugeTTL(t *testing.T) {
	tr, err := scheduling.NewTracker(scheduling.TrackerConfig{TTL: time.Duration(math.MaxInt64)})
	require.NoError(t, err)
	require.NoError(t, tr.Add(1, kvroute.WorkerKey{ID: 1}, nil, 10))
	require.Zero(t, tr.Expire())
	require.Equal(t, 1, tr.Load(kvroute.WorkerKey{ID: 1}).ActiveRequests)
}

// An expected output too long for the int sums of the decode term gives
// large costs that keep their order, never negative ones.
func TestDynamoCostHugeOutput(t *testing.T) {
	d, err := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{BlockSize: 1})
	require.NoError(t, err)
	req := scheduling.Request{PromptTokens: 10, Blocks: 10, BlockSize: 1, ExpectedOutputTokens: math.MaxInt}
	cands := []scheduling.Candidate{
		{Load: scheduling.Load{PotentialDecodeBlocks: 10, KVCapacityBlocks: 100}},
		{Load: scheduling.Load{PotentialDecodeBlocks: 500, ActivePrefillTokens: 1000, KVCapacityBlocks: 100}},
	}
	costs := make([]float64, 2)
	d.Costs(&req, cands, costs)
	require.Positive(t, costs[0])
	require.GreaterOrEqual(t, costs[1], costs[0])
}
