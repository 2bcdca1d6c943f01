package bench

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
	"github.com/stretchr/testify/require"
)

// kvWorker is one candidate of TestKVPressure: the prompt blocks it caches,
// its distinct active KV blocks, those it would hold with the request, and
// its active requests.
type kvWorker struct {
	cached, active, potential, requests int
}

func TestKVPressure(t *testing.T) {
	// A 1.6K-token prompt (100 blocks, 94 of them a shared system prompt)
	// on workers of 800 blocks, as on Dynamo's mocker engines.
	const capacity = 800
	held := func(w float64) KVPressureConfig { return KVPressureConfig{Weight: w} }
	added := func(w float64) KVPressureConfig { return KVPressureConfig{Weight: w, Measure: KVPressureAdded} }
	var (
		inFlight   = kvWorker{cached: 94, active: 200, potential: 206, requests: 2}
		oneAhead   = kvWorker{cached: 94, active: 200, potential: 300, requests: 2}
		twoAhead   = kvWorker{cached: 94, active: 300, potential: 400, requests: 3}
		idle       = kvWorker{potential: 100}
		busyOne    = kvWorker{active: 100, potential: 200, requests: 1}
		overstated = kvWorker{cached: 94, active: 700, potential: 706, requests: 2} // inFlight with 500 reported blocks more
	)
	tests := []struct {
		name     string
		cfg      KVPressureConfig
		capacity int
		workers  []kvWorker
		want     int // index of the cheapest candidate
	}{
		{name: "held: holder with the prefix in flight takes it over an idle worker", cfg: held(8000), capacity: capacity,
			workers: []kvWorker{inFlight, idle}, want: 0},
		{name: "held: holder one distinct prompt ahead keeps it", cfg: held(8000), capacity: capacity,
			workers: []kvWorker{oneAhead, busyOne}, want: 0},
		{name: "held: holder two distinct prompts ahead loses it", cfg: held(8000), capacity: capacity,
			workers: []kvWorker{twoAhead, busyOne}, want: 1},
		{name: "held: without the term the holder keeps it", cfg: held(0), capacity: capacity,
			workers: []kvWorker{twoAhead, busyOne}, want: 0},
		{name: "held: a large cache makes the term small", cfg: held(8000), capacity: 32768,
			workers: []kvWorker{twoAhead, busyOne}, want: 0},
		{name: "held: unknown capacity adds nothing", cfg: held(8000), capacity: 0,
			workers: []kvWorker{twoAhead, busyOne}, want: 0},
		{name: "held: blocks reported beyond the router's count push the holder away", cfg: held(8000), capacity: capacity,
			workers: []kvWorker{overstated, idle}, want: 1},
		{name: "added: holder with the prefix in flight takes it over an idle worker", cfg: added(8000), capacity: capacity,
			workers: []kvWorker{inFlight, idle}, want: 0},
		{name: "added: blocks reported beyond the router's count leave the holder first", cfg: added(8000), capacity: capacity,
			workers: []kvWorker{overstated, idle}, want: 0},
		{name: "added: holder of two new-prompt requests loses a third prompt to an idle worker", cfg: added(8000), capacity: capacity,
			workers: []kvWorker{oneAhead, idle}, want: 1},
		{name: "added: holder one distinct prompt ahead keeps it", cfg: added(8000), capacity: capacity,
			workers: []kvWorker{oneAhead, busyOne}, want: 0},
		{name: "added: holder two distinct prompts ahead loses it", cfg: added(8000), capacity: capacity,
			workers: []kvWorker{twoAhead, busyOne}, want: 1},
	}
	inner, err := scheduling.NewDynamoCost(PreviousCostConfig())
	require.NoError(t, err)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := NewKVPressure(inner, tt.cfg)
			require.NoError(t, err)
			req := &scheduling.Request{PromptTokens: 1600, Blocks: 100}
			cs := make([]scheduling.Candidate, len(tt.workers))
			for i, w := range tt.workers {
				cs[i].Worker = kvroute.WorkerKey{ID: kvroute.WorkerID(i + 1)}
				cs[i].Cached[kvroute.TierDevice] = w.cached
				cs[i].Load = scheduling.Load{ActiveDecodeBlocks: w.active, PotentialDecodeBlocks: w.potential,
					ActiveRequests: w.requests, KVCapacityBlocks: tt.capacity}
			}
			base := make([]float64, len(cs))
			inner.Costs(req, cs, base)
			costs := make([]float64, len(cs))
			k.Costs(req, cs, costs)
			require.Equal(t, tt.want, argminOf(costs))
			for i, w := range tt.workers {
				var extra float64
				if tt.capacity > 0 {
					blocks := float64(w.potential)
					if tt.cfg.Measure == KVPressureAdded {
						blocks = float64((w.potential - w.active) * (w.requests + 1))
					}
					extra = tt.cfg.Weight * blocks / float64(tt.capacity)
				}
				require.InDelta(t, base[i]+extra, costs[i], 1e-9, "candidate %d", i)
			}
			if tt.cfg.Measure != KVPressureHeld {
				return
			}
			// The held measure is scheduling.DynamoCost's KV-pressure term:
			// the same costs, bit for bit.
			cfg := PreviousCostConfig()
			cfg.KVPressureWeight = tt.cfg.Weight
			folded, err := scheduling.NewDynamoCost(cfg)
			require.NoError(t, err)
			got := make([]float64, len(cs))
			folded.Costs(req, cs, got)
			for i := range costs {
				require.Equal(t, math.Float64bits(costs[i]), math.Float64bits(got[i]), "candidate %d: %v vs %v", i, costs[i], got[i])
			}
		})
	}
}

func TestNewKVPressureRejects(t *testing.T) {
	inner, err := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{})
	require.NoError(t, err)
	for _, tt := range []struct {
		name  string
		inner scheduling.CostFunc
		cfg   KVPressureConfig
	}{
		{"nil inner", nil, KVPressureConfig{Weight: 1}},
		{"negative weight", inner, KVPressureConfig{Weight: -1}},
		{"NaN weight", inner, KVPressureConfig{Weight: math.NaN()}},
		{"infinite weight", inner, KVPressureConfig{Weight: math.Inf(1)}},
		{"unknown measure", inner, KVPressureConfig{Weight: 1, Measure: KVPressureAdded + 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewKVPressure(tt.inner, tt.cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
		})
	}
}

// argminOf returns the index of the smallest cost, the first on ties.
func argminOf(costs []float64) int {
	best := 0
	for i, c := range costs {
		if c < costs[best] {
			best = i
		}
	}
	return best
}
