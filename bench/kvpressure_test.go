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
	tests := []struct {
		name     string
		weight   float64
		capacity int
		workers  []kvWorker
		want     int // index of the cheapest candidate
	}{
		{
			name: "holder with the prefix in flight takes it over an idle worker", weight: 8000, capacity: capacity,
			workers: []kvWorker{{cached: 94, active: 200, potential: 206, requests: 2}, {potential: 100}},
			want:    0,
		},
		{
			name: "holder one distinct prompt ahead keeps it", weight: 8000, capacity: capacity,
			workers: []kvWorker{{cached: 94, active: 200, potential: 300, requests: 2}, {active: 100, potential: 200, requests: 1}},
			want:    0,
		},
		{
			name: "holder two distinct prompts ahead loses it", weight: 8000, capacity: capacity,
			workers: []kvWorker{{cached: 94, active: 300, potential: 400, requests: 3}, {active: 100, potential: 200, requests: 1}},
			want:    1,
		},
		{
			name: "without the term the holder keeps it", weight: 0, capacity: capacity,
			workers: []kvWorker{{cached: 94, active: 300, potential: 400, requests: 3}, {active: 100, potential: 200, requests: 1}},
			want:    0,
		},
		{
			name: "a large cache makes the term small", weight: 8000, capacity: 32768,
			workers: []kvWorker{{cached: 94, active: 300, potential: 400, requests: 3}, {active: 100, potential: 200, requests: 1}},
			want:    0,
		},
		{
			name: "unknown capacity adds nothing", weight: 8000, capacity: 0,
			workers: []kvWorker{{cached: 94, active: 300, potential: 400, requests: 3}, {active: 100, potential: 200, requests: 1}},
			want:    0,
		},
	}
	inner, err := scheduling.NewDynamoCost(scheduling.DefaultCostConfig())
	require.NoError(t, err)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := NewKVPressure(inner, tt.weight)
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
			for i, c := range cs {
				var extra float64
				if tt.capacity > 0 {
					extra = tt.weight * float64(c.Load.PotentialDecodeBlocks) / float64(tt.capacity)
				}
				require.InDelta(t, base[i]+extra, costs[i], 1e-9, "candidate %d", i)
			}
		})
	}
}

func TestNewKVPressureRejects(t *testing.T) {
	inner, err := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{})
	require.NoError(t, err)
	for _, tt := range []struct {
		name   string
		inner  scheduling.CostFunc
		weight float64
	}{
		{"nil inner", nil, 1},
		{"negative weight", inner, -1},
		{"NaN weight", inner, math.NaN()},
		{"infinite weight", inner, math.Inf(1)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewKVPressure(tt.inner, tt.weight)
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
