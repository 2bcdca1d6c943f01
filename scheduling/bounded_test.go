package scheduling_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

func TestBoundedLoad(t *testing.T) {
	cached := func(n int) [kvroute.NumTiers]int { return [kvroute.NumTiers]int{n} }
	// A 10-block prompt; the first worker holds all of it.
	req := scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16}
	tests := []struct {
		name   string
		factor float64
		active []int // active requests per worker
		want   int   // chosen worker index
	}{
		{name: "idle pool: the cache wins", active: []int{0, 0, 0, 0}, want: 0},
		{name: "holder within the bound keeps the prefix", active: []int{2, 1, 2, 2}, want: 0},
		{name: "holder at the bound: the least costly other worker", factor: 1.5, active: []int{3, 2, 0, 1}, want: 2},
		{name: "a larger factor lets the holder take more", factor: 2, active: []int{3, 2, 0, 1}, want: 0},
		{name: "the default factor is 2", active: []int{3, 2, 0, 1}, want: 0},
		{name: "holder over the default bound", active: []int{5, 2, 0, 1}, want: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inner, err := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{OverlapWeight: scheduling.Float(2), PrefillLoadScale: scheduling.Float(16)})
			require.NoError(t, err)
			b, err := scheduling.NewBoundedLoad(inner, scheduling.BoundedLoadConfig{Factor: tc.factor, Measure: scheduling.MeasureRequests})
			require.NoError(t, err)
			cands := make([]scheduling.Candidate, len(tc.active))
			for i, a := range tc.active {
				cands[i] = scheduling.Candidate{Worker: worker(uint64(i + 1)), Load: scheduling.Load{ActiveRequests: a, PotentialDecodeBlocks: 10 * (a + 1)}}
			}
			cands[0].Cached = cached(10)
			sel, err := scheduling.NewSelector(scheduling.SelectorConfig{Seed: 1})
			require.NoError(t, err)
			costs := make([]float64, len(cands))
			i, err := scheduling.Choose(b, sel, &req, cands, costs)
			require.NoError(t, err)
			require.Equal(t, tc.want, i, "costs %v", costs)
		})
	}
}

func TestBoundedLoadIgnoresQueueDepth(t *testing.T) {
	inner, err := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{})
	require.NoError(t, err)
	b, err := scheduling.NewBoundedLoad(inner, scheduling.BoundedLoadConfig{Factor: 1.5, Measure: scheduling.MeasureRequests})
	require.NoError(t, err)
	req := scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16}
	// The engine reports as queued requests the router already counts as
	// active: only ActiveRequests is bounded.
	cands := []scheduling.Candidate{
		{Worker: worker(1), Cached: [kvroute.NumTiers]int{10}, Load: scheduling.Load{ActiveRequests: 2, QueueDepth: 2}},
		{Worker: worker(2), Load: scheduling.Load{ActiveRequests: 1}},
	}
	costs := make([]float64, 2)
	b.Costs(&req, cands, costs)
	require.Less(t, costs[0], costs[1], "3 of 4 is within ⌈1.5·4/2⌉ = 3")
	cands[0].Load.ActiveRequests, cands[1].Load.ActiveRequests = 3, 0
	b.Costs(&req, cands, costs)
	require.Greater(t, costs[0], costs[1], "4 of 4 is above ⌈1.5·4/2⌉ = 3")
}

func TestBoundedLoadKVBlocks(t *testing.T) {
	inner, err := scheduling.NewDynamoCost(scheduling.DefaultCostConfig())
	require.NoError(t, err)
	b, err := scheduling.NewBoundedLoad(inner, scheduling.BoundedLoadConfig{Factor: 1.5, Measure: scheduling.MeasureKVBlocks})
	require.NoError(t, err)
	// A 100-block prompt. Worker 1 holds its prefix and runs two requests
	// sharing it (106 distinct blocks); the request would add 6 there.
	req := scheduling.Request{PromptTokens: 1600, Blocks: 100, BlockSize: 16}
	shared := scheduling.Candidate{Worker: worker(1), Cached: [kvroute.NumTiers]int{94},
		Load: scheduling.Load{ActiveRequests: 2, ActiveDecodeBlocks: 106, PotentialDecodeBlocks: 112}}
	distinct := func(id uint64, reqs int) scheduling.Candidate {
		return scheduling.Candidate{Worker: worker(id), Load: scheduling.Load{ActiveRequests: reqs,
			ActiveDecodeBlocks: 100 * reqs, PotentialDecodeBlocks: 100*reqs + 100}}
	}
	costs := make([]float64, 4)
	cands := []scheduling.Candidate{shared, distinct(2, 2), distinct(3, 2), distinct(4, 1)}
	b.Costs(&req, cands, costs)
	require.Less(t, costs[0], overBoundCost, "the shared prefix gathers: 112 blocks of a ⌈1.5·(606+100)/400⌉·100 = 300 bound")
	require.Equal(t, 0, argmin(costs))

	// The same worker also holding three unrelated prompts would hold 406
	// blocks, over ⌈1.5·(900+100)/400⌉·100 = 400: the least costly other
	// worker gets the request.
	cands[0].Load.ActiveDecodeBlocks, cands[0].Load.PotentialDecodeBlocks = 400, 406
	b.Costs(&req, cands, costs)
	require.Greater(t, costs[0], overBoundCost)
	require.Equal(t, 3, argmin(costs))

	// An idle pool: every worker is within the bound.
	for i := range cands {
		cands[i].Load = scheduling.Load{PotentialDecodeBlocks: 100}
	}
	b.Costs(&req, cands, costs)
	for i := range costs {
		require.Less(t, costs[i], overBoundCost)
	}
	require.Equal(t, 0, argmin(costs))
}

// overBoundCost is below what BoundedLoad adds to a candidate over the bound.
const overBoundCost = 1e14

func argmin(costs []float64) int {
	best := 0
	for i, c := range costs {
		if c < costs[best] {
			best = i
		}
	}
	return best
}

func TestNewBoundedLoadRejects(t *testing.T) {
	inner, err := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{})
	require.NoError(t, err)
	for _, f := range []float64{0.5, -1, math.Inf(1)} {
		_, err := scheduling.NewBoundedLoad(inner, scheduling.BoundedLoadConfig{Factor: f})
		require.ErrorIs(t, err, scheduling.ErrInvalidConfig, "factor %v", f)
	}
	_, err = scheduling.NewBoundedLoad(inner, scheduling.BoundedLoadConfig{Measure: 7})
	require.ErrorIs(t, err, scheduling.ErrInvalidConfig)
	_, err = scheduling.NewBoundedLoad(nil, scheduling.BoundedLoadConfig{})
	require.ErrorIs(t, err, scheduling.ErrInvalidConfig)
}
