package scheduling_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

func worker(id uint64) kvroute.WorkerKey { return kvroute.WorkerKey{ID: kvroute.WorkerID(id)} }

// dynamoSeed is the example from Dynamo's router documentation: a 10-block
// request (block size 16) and three workers.
func dynamoSeed() (scheduling.Request, []scheduling.Candidate) {
	req := scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16}
	cands := []scheduling.Candidate{
		{Worker: worker(1), Cached: [kvroute.NumTiers]int{2}, Load: scheduling.Load{PotentialDecodeBlocks: 10}},
		{Worker: worker(2), Cached: [kvroute.NumTiers]int{5}, Load: scheduling.Load{PotentialDecodeBlocks: 5}},
		{Worker: worker(3), Cached: [kvroute.NumTiers]int{8}, Load: scheduling.Load{PotentialDecodeBlocks: 9}},
	}
	return req, cands
}

func TestDynamoCostSeedExample(t *testing.T) {
	cost, err := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{OverlapWeight: scheduling.Float(1)})
	require.NoError(t, err)
	sel, err := scheduling.NewSelector(scheduling.SelectorConfig{Seed: 1})
	require.NoError(t, err)
	req, cands := dynamoSeed()
	costs := make([]float64, len(cands))
	i, err := scheduling.Choose(cost, sel, &req, cands, costs)
	require.NoError(t, err)
	require.Equal(t, []float64{18, 10, 11}, costs)
	require.Equal(t, worker(2), cands[i].Worker)
}

func TestDynamoCost(t *testing.T) {
	host := func(n int) [kvroute.NumTiers]int { return [kvroute.NumTiers]int{0, n} }
	tests := []struct {
		name string
		cfg  scheduling.DynamoCostConfig
		req  scheduling.Request
		cand scheduling.Candidate
		want float64
	}{
		{
			name: "no cache, no load: the whole prompt is prefill and decode",
			req:  scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16},
			cand: scheduling.Candidate{Load: scheduling.Load{PotentialDecodeBlocks: 10}},
			want: 20,
		},
		{
			name: "active prefill tokens add to the prefill term",
			req:  scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16},
			cand: scheduling.Candidate{Cached: [kvroute.NumTiers]int{4}, Load: scheduling.Load{ActivePrefillTokens: 320, PotentialDecodeBlocks: 12}},
			want: (320+160)/16 - 4 + 12,
		},
		{
			name: "fractional blocks are kept",
			req:  scheduling.Request{PromptTokens: 100, Blocks: 6, BlockSize: 16},
			cand: scheduling.Candidate{Load: scheduling.Load{PotentialDecodeBlocks: 6}},
			want: 100.0/16 + 6,
		},
		{
			name: "host blocks count 0.75",
			req:  scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16},
			cand: scheduling.Candidate{Cached: host(4), Load: scheduling.Load{PotentialDecodeBlocks: 10}},
			want: 10 - 3 + 10,
		},
		{
			name: "every tier at its default weight",
			req:  scheduling.Request{PromptTokens: 320, Blocks: 20, BlockSize: 16},
			cand: scheduling.Candidate{Cached: [kvroute.NumTiers]int{4, 4, 4, 4}},
			want: 20 - (4 + 3 + 1 + 1),
		},
		{
			name: "custom tier weights",
			cfg:  scheduling.DynamoCostConfig{TierWeights: &scheduling.TierWeights{1, 0.5, 0, 0.5}},
			req:  scheduling.Request{PromptTokens: 320, Blocks: 20, BlockSize: 16},
			cand: scheduling.Candidate{Cached: [kvroute.NumTiers]int{4, 4, 4, 4}},
			want: 20 - (4 + 2 + 0 + 2),
		},
		{
			name: "overlap weight scales the credit",
			cfg:  scheduling.DynamoCostConfig{OverlapWeight: scheduling.Float(2)},
			req:  scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16},
			cand: scheduling.Candidate{Cached: [kvroute.NumTiers]int{3}, Load: scheduling.Load{PotentialDecodeBlocks: 10}},
			want: 10 - 6 + 10,
		},
		{
			name: "credit larger than the prefill clamps at zero",
			cfg:  scheduling.DynamoCostConfig{OverlapWeight: scheduling.Float(3)},
			req:  scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16},
			cand: scheduling.Candidate{Cached: [kvroute.NumTiers]int{10}, Load: scheduling.Load{PotentialDecodeBlocks: 10}},
			want: 10,
		},
		{
			name: "prefill load scale",
			cfg:  scheduling.DynamoCostConfig{PrefillLoadScale: scheduling.Float(0.5)},
			req:  scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16},
			cand: scheduling.Candidate{Cached: [kvroute.NumTiers]int{2}, Load: scheduling.Load{PotentialDecodeBlocks: 10}},
			want: 0.5*8 + 10,
		},
		{
			name: "per-request overrides win over the config",
			cfg:  scheduling.DynamoCostConfig{PrefillLoadScale: scheduling.Float(0.5)},
			req: scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16, Overrides: scheduling.Overrides{
				OverlapWeight: scheduling.Float(0), PrefillLoadScale: scheduling.Float(2),
			}},
			cand: scheduling.Candidate{Cached: [kvroute.NumTiers]int{2}, Load: scheduling.Load{PotentialDecodeBlocks: 10}},
			want: 2*10 + 10,
		},
		{
			name: "invalid overrides are ignored",
			req: scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16, Overrides: scheduling.Overrides{
				OverlapWeight: scheduling.Float(math.NaN()), PrefillLoadScale: scheduling.Float(-1),
			}},
			cand: scheduling.Candidate{Cached: [kvroute.NumTiers]int{2}, Load: scheduling.Load{PotentialDecodeBlocks: 10}},
			want: 18,
		},
		{
			name: "active request weight",
			cfg:  scheduling.DynamoCostConfig{ActiveRequestWeight: 0.5},
			req:  scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16},
			cand: scheduling.Candidate{Load: scheduling.Load{PotentialDecodeBlocks: 10, ActiveRequests: 4}},
			want: 10 + 10 + 2,
		},
		{
			name: "kv pressure charges the blocks held in flight as a share of the capacity",
			cfg:  scheduling.DynamoCostConfig{KVPressureWeight: 800},
			req:  scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16},
			cand: scheduling.Candidate{Load: scheduling.Load{ActiveDecodeBlocks: 30, PotentialDecodeBlocks: 40, KVCapacityBlocks: 400}},
			want: 10 + 40 + 800*40.0/400,
		},
		{
			name: "kv pressure adds to the charge for blocks over the capacity",
			cfg:  scheduling.DynamoCostConfig{KVPressureWeight: 100},
			req:  scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16},
			cand: scheduling.Candidate{Load: scheduling.Load{PotentialDecodeBlocks: 60, KVCapacityBlocks: 50}},
			want: 10 + 60 + 10 + 100*60.0/50,
		},
		{
			name: "kv pressure is nothing when the capacity is unknown",
			cfg:  scheduling.DynamoCostConfig{KVPressureWeight: 800},
			req:  scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16},
			cand: scheduling.Candidate{Load: scheduling.Load{PotentialDecodeBlocks: 40}},
			want: 10 + 40,
		},
		{
			name: "the default config: cache-weighted prefill, requests and kv pressure",
			cfg:  scheduling.DefaultCostConfig(),
			req:  scheduling.Request{PromptTokens: 1600, Blocks: 100, BlockSize: 16},
			cand: scheduling.Candidate{Cached: [kvroute.NumTiers]int{40}, Load: scheduling.Load{ActiveRequests: 2, ActivePrefillTokens: 320,
				ActiveDecodeBlocks: 200, PotentialDecodeBlocks: 260, KVCapacityBlocks: 800}},
			want: 16*((320.0+1600)/16-2*40) + 260 + 16*2 + 8000*260.0/800,
		},
		{
			name: "configured block size when the request has none",
			cfg:  scheduling.DynamoCostConfig{BlockSize: 64},
			req:  scheduling.Request{PromptTokens: 640, Blocks: 10},
			cand: scheduling.Candidate{Cached: [kvroute.NumTiers]int{2}, Load: scheduling.Load{PotentialDecodeBlocks: 10}},
			want: 18,
		},
		{
			name: "overlap discount removes part of the credit",
			req:  scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16},
			cand: scheduling.Candidate{Cached: [kvroute.NumTiers]int{8}, OverlapDiscount: 0.5, Load: scheduling.Load{PotentialDecodeBlocks: 9}},
			want: 10 - 4 + 9,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cost, err := scheduling.NewDynamoCost(tt.cfg)
			require.NoError(t, err)
			costs := []float64{math.NaN()}
			cost.Costs(&tt.req, []scheduling.Candidate{tt.cand}, costs)
			require.InDelta(t, tt.want, costs[0], 1e-12)
		})
	}
}

func TestCostConfigValidation(t *testing.T) {
	bad := []scheduling.DynamoCostConfig{
		{OverlapWeight: scheduling.Float(-1)},
		{PrefillLoadScale: scheduling.Float(math.Inf(1))},
		{TierWeights: &scheduling.TierWeights{1, math.NaN()}},
		{ActiveRequestWeight: -0.1},
		{KVPressureWeight: -1},
		{KVPressureWeight: math.NaN()},
		{KVPressureWeight: math.Inf(1)},
		{BlockSize: -16},
	}
	for _, cfg := range bad {
		_, err := scheduling.NewDynamoCost(cfg)
		require.ErrorIs(t, err, scheduling.ErrInvalidConfig, "%+v", cfg)
	}
	_, err := scheduling.NewWeightedScore(scheduling.WeightedScoreConfig{LoadWeight: scheduling.Float(-0.3)})
	require.ErrorIs(t, err, scheduling.ErrInvalidConfig)
	_, err = scheduling.NewStalenessCost(nil, scheduling.StalenessConfig{})
	require.ErrorIs(t, err, scheduling.ErrInvalidConfig)
	_, err = scheduling.NewStalenessCost(scheduling.Random{}, scheduling.StalenessConfig{Interval: -time.Second})
	require.ErrorIs(t, err, scheduling.ErrInvalidConfig)
}

func TestWeightedScore(t *testing.T) {
	score, err := scheduling.NewWeightedScore(scheduling.WeightedScoreConfig{})
	require.NoError(t, err)
	req := scheduling.Request{PromptTokens: 1600, Blocks: 100, BlockSize: 16}
	cands := []scheduling.Candidate{
		// 87% overlap, the busiest (12): 0.6·0.87 − 0.3·1 = 0.222.
		{Worker: worker(1), Cached: [kvroute.NumTiers]int{87}, Load: scheduling.Load{ActiveRequests: 12, MaxRequests: 512}},
		// 65% overlap, 2 of the busiest's 12: 0.6·0.65 − 0.3·2/12 = 0.34.
		{Worker: worker(2), Cached: [kvroute.NumTiers]int{65}, Load: scheduling.Load{ActiveRequests: 2, MaxRequests: 512}},
	}
	costs := make([]float64, 2)
	sel, err := scheduling.NewSelector(scheduling.SelectorConfig{Seed: 1})
	require.NoError(t, err)
	i, err := scheduling.Choose(score, sel, &req, cands, costs)
	require.NoError(t, err)
	require.InDelta(t, -0.222, costs[0], 1e-12)
	require.InDelta(t, -0.34, costs[1], 1e-12)
	// Large slot counts do not hide the load: the prefix holder loses once
	// it is much busier than the other worker.
	require.Equal(t, worker(2), cands[i].Worker)

	tests := []struct {
		name string
		req  scheduling.Request
		cand []scheduling.Candidate
		want []float64
	}{
		{
			name: "memory term",
			req:  scheduling.Request{Blocks: 10},
			cand: []scheduling.Candidate{{Cached: [kvroute.NumTiers]int{5}, Load: scheduling.Load{MaxRequests: 10, ActiveRequests: 5, KVUtilization: 0.5}}, {Load: scheduling.Load{ActiveRequests: 10}}},
			want: []float64{-(0.6*0.5 - 0.3*0.5 - 0.1*0.5), 0.3},
		},
		{
			name: "queue depth counts as load",
			req:  scheduling.Request{Blocks: 10},
			cand: []scheduling.Candidate{{Load: scheduling.Load{MaxRequests: 8, ActiveRequests: 4, QueueDepth: 4}}, {Load: scheduling.Load{ActiveRequests: 4}}},
			want: []float64{0.3, 0.15},
		},
		{
			name: "load relative to the busiest candidate",
			req:  scheduling.Request{Blocks: 10},
			cand: []scheduling.Candidate{{Load: scheduling.Load{ActiveRequests: 2}}, {Load: scheduling.Load{ActiveRequests: 8}}},
			want: []float64{0.3 * 0.25, 0.3},
		},
		{
			name: "overridden weights",
			req: scheduling.Request{Blocks: 10, Overrides: scheduling.Overrides{
				CacheWeight: scheduling.Float(1), LoadWeight: scheduling.Float(0), MemoryWeight: scheduling.Float(0),
			}},
			cand: []scheduling.Candidate{{Cached: [kvroute.NumTiers]int{4, 4}, Load: scheduling.Load{MaxRequests: 4, ActiveRequests: 4, KVUtilization: 1}}},
			want: []float64{-(4 + 3) / 10.0},
		},
		{
			name: "all idle: no load term",
			req:  scheduling.Request{Blocks: 10},
			cand: []scheduling.Candidate{{Load: scheduling.Load{MaxRequests: 8}}, {}},
			want: []float64{0, 0},
		},
		{
			name: "empty prompt has no cache term",
			req:  scheduling.Request{},
			cand: []scheduling.Candidate{{Cached: [kvroute.NumTiers]int{4}}},
			want: []float64{0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make([]float64, len(tt.cand))
			score.Costs(&tt.req, tt.cand, got)
			require.InDeltaSlice(t, tt.want, got, 1e-12)
		})
	}
}

func TestFreshness(t *testing.T) {
	tests := []struct {
		age, interval time.Duration
		want          float64
	}{
		{0, time.Second, 1},
		{time.Second, time.Second, 1},
		{2500 * time.Millisecond, time.Second, 0.5},
		{2 * time.Second, time.Second, 1 - 1.0/3},
		{4 * time.Second, time.Second, 0},
		{time.Minute, time.Second, 0},
		{-time.Second, time.Second, 1},
		{time.Hour, 0, 1},
	}
	for _, tt := range tests {
		require.InDelta(t, tt.want, scheduling.Freshness(tt.age, tt.interval), 1e-12, "age %v interval %v", tt.age, tt.interval)
	}
}

func TestStalenessCost(t *testing.T) {
	clock := newManualClock()
	inner, err := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{})
	require.NoError(t, err)
	cost, err := scheduling.NewStalenessCost(inner, scheduling.StalenessConfig{Interval: time.Second, Clock: clock})
	require.NoError(t, err)
	req, cands := dynamoSeed()
	now := clock.Now()
	cands[0].LastUpdate = now                               // fresh
	cands[1].LastUpdate = now.Add(-2500 * time.Millisecond) // freshness 0.5
	cands[2].LastUpdate = time.Time{}                       // unknown: trusted
	costs := make([]float64, 3)
	cost.Costs(&req, cands, costs)
	require.Equal(t, []float64{18, 10 - 2.5 + 5, 11}, costs)
	require.Equal(t, 0.5, cands[1].OverlapDiscount)

	// Much later, worker 3 has a last update: it is stale and loses its credit.
	clock.Advance(time.Minute)
	cands[2].LastUpdate = now
	cost.Costs(&req, cands, costs)
	require.Equal(t, []float64{10 + 10, 10 + 5, 10 + 9}, costs)
}

func TestBaselines(t *testing.T) {
	req := scheduling.Request{}
	cands := []scheduling.Candidate{
		{Load: scheduling.Load{ActiveRequests: 3, ActivePrefillTokens: 10}},
		{Load: scheduling.Load{ActiveRequests: 1, QueueDepth: 1, ActivePrefillTokens: 500}},
		{Load: scheduling.Load{ActiveRequests: 5, ActivePrefillTokens: 0}},
	}
	costs := make([]float64, 3)

	scheduling.LeastLoaded{}.Costs(&req, cands, costs)
	require.Equal(t, []float64{3, 2, 5}, costs)
	scheduling.LeastLoaded{By: scheduling.ByPrefillTokens}.Costs(&req, cands, costs)
	require.Equal(t, []float64{10, 500, 0}, costs)

	scheduling.Random{}.Costs(&req, cands, costs)
	require.Equal(t, []float64{0, 0, 0}, costs)

	var rr scheduling.RoundRobin
	sel, err := scheduling.NewSelector(scheduling.SelectorConfig{Seed: 1})
	require.NoError(t, err)
	var order []int
	for range 6 {
		i, err := scheduling.Choose(&rr, sel, &req, cands, costs)
		require.NoError(t, err)
		order = append(order, i)
	}
	require.Equal(t, []int{0, 1, 2, 0, 1, 2}, order)

	counts := make([]int, 3)
	for range 3000 {
		i, err := scheduling.Choose(scheduling.Random{}, sel, &req, cands, costs)
		require.NoError(t, err)
		counts[i]++
	}
	for i, n := range counts {
		require.Greater(t, n, 800, "worker %d chosen %d of 3000 times", i, n)
	}
}

func TestCostFuncFunc(t *testing.T) {
	f := scheduling.CostFuncFunc(func(_ *scheduling.Request, cands []scheduling.Candidate, costs []float64) {
		for i := range cands {
			costs[i] = float64(cands[i].Worker.ID)
		}
	})
	sel, err := scheduling.NewSelector(scheduling.SelectorConfig{Seed: 1})
	require.NoError(t, err)
	req := scheduling.Request{}
	i, err := scheduling.Choose(f, sel, &req, []scheduling.Candidate{{Worker: worker(9)}, {Worker: worker(4)}}, make([]float64, 2))
	require.NoError(t, err)
	require.Equal(t, 1, i)

	_, err = scheduling.Choose(f, sel, &req, nil, nil)
	require.ErrorIs(t, err, scheduling.ErrNoCandidates)
	_, err = scheduling.Choose(f, sel, &req, []scheduling.Candidate{{}, {}}, make([]float64, 1))
	require.ErrorIs(t, err, scheduling.ErrInvalidRequest)
}

func TestDynamoCostExpectedOutput(t *testing.T) {
	cost, err := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{})
	require.NoError(t, err)
	tests := []struct {
		name string
		out  int
		load scheduling.Load
		want float64
	}{
		{"unknown output", 0, scheduling.Load{PotentialDecodeBlocks: 10}, 10 + 10},
		{"output blocks join the decode term", 33, scheduling.Load{PotentialDecodeBlocks: 10}, 10 + 10 + 3},
		{"room in the cache", 32, scheduling.Load{PotentialDecodeBlocks: 10, KVCapacityBlocks: 12}, 10 + 12},
		{"blocks past the capacity count twice", 64, scheduling.Load{PotentialDecodeBlocks: 10, KVCapacityBlocks: 12}, 10 + 14 + 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16, ExpectedOutputTokens: tt.out}
			got := make([]float64, 1)
			cost.Costs(&req, []scheduling.Candidate{{Load: tt.load}}, got)
			require.Equal(t, tt.want, got[0])
		})
	}
	// A long expected output steers the request away from a worker whose
	// cache cannot hold it.
	req := scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16, ExpectedOutputTokens: 1600}
	cands := []scheduling.Candidate{
		{Worker: worker(1), Cached: [kvroute.NumTiers]int{4}, Load: scheduling.Load{PotentialDecodeBlocks: 10, KVCapacityBlocks: 64}},
		{Worker: worker(2), Load: scheduling.Load{PotentialDecodeBlocks: 10, KVCapacityBlocks: 1024}},
	}
	sel := newSelector(t, 0, 1)
	costs := make([]float64, 2)
	i, err := scheduling.Choose(cost, sel, &req, cands, costs)
	require.NoError(t, err)
	require.Equal(t, worker(2), cands[i].Worker, "costs %v", costs)
	req.ExpectedOutputTokens = 0
	i, err = scheduling.Choose(cost, sel, &req, cands, costs)
	require.NoError(t, err)
	require.Equal(t, worker(1), cands[i].Worker, "costs %v", costs)
}

// Capacities keeps a load's capacities and zeroes every count.
func TestLoadCapacities(t *testing.T) {
	in := scheduling.Load{
		ActivePrefillTokens: 100, ActiveDecodeBlocks: 7, PotentialDecodeBlocks: 9, ActiveRequests: 3,
		MaxRequests: 64, QueueDepth: 2, KVUtilization: 0.5, KVCapacityBlocks: 800, MaxBatchedTokens: 8192,
		PrefillTokensPerSecond: 2e4,
	}
	want := scheduling.Load{MaxRequests: 64, KVCapacityBlocks: 800, MaxBatchedTokens: 8192, PrefillTokensPerSecond: 2e4}
	if got := in.Capacities(); got != want {
		t.Fatalf("Capacities() = %+v, want %+v", got, want)
	}
}
