package scheduling_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

// TestChooseDefaultCostMatchesGeneric checks that Choose's one-pass path
// for a BoundedLoad around a DynamoCost gives the costs and the choices of
// the cost's Costs followed by Selector.Select, bit for bit and draw for
// draw, over many random candidate sets with many ties, for each load
// measure, factor and selector temperature, with and without per-request
// overrides.
func TestChooseDefaultCostMatchesGeneric(t *testing.T) {
	temps := []scheduling.OptFloat{{}, scheduling.Float(0), scheduling.Float(0.3), scheduling.Float(2), scheduling.Float(-1), scheduling.Float(math.Inf(1))}
	tests := []struct {
		name    string
		measure scheduling.LoadMeasure
		factor  float64
		temp    float64 // the selector's own temperature
	}{
		{name: "requests, default factor, argmin", measure: scheduling.MeasureRequests},
		{name: "requests, factor 1, argmin", measure: scheduling.MeasureRequests, factor: 1},
		{name: "kv blocks, default factor, argmin", measure: scheduling.MeasureKVBlocks},
		{name: "kv blocks, factor 3, softmax", measure: scheduling.MeasureKVBlocks, factor: 3, temp: 0.5},
		{name: "requests, default factor, softmax", measure: scheduling.MeasureRequests, temp: 1},
	}
	for ti, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, cfg := range []scheduling.DynamoCostConfig{scheduling.DefaultCostConfig(), {}, {OverlapWeight: scheduling.Float(0), TierWeights: &scheduling.TierWeights{1, 0.5, 0, 0}, BlockSize: 32}} {
				inner, err := scheduling.NewDynamoCost(cfg)
				require.NoError(t, err)
				b, err := scheduling.NewBoundedLoad(inner, scheduling.BoundedLoadConfig{Factor: tc.factor, Measure: tc.measure})
				require.NoError(t, err)
				generic := scheduling.CostFuncFunc(b.Costs) // hides the type: Choose takes its generic path
				fused, err := scheduling.NewSelector(scheduling.SelectorConfig{Temperature: tc.temp, Seed: 42})
				require.NoError(t, err)
				plain, err := scheduling.NewSelector(scheduling.SelectorConfig{Temperature: tc.temp, Seed: 42})
				require.NoError(t, err)
				rng := rand.New(rand.NewPCG(uint64(ti), 1))
				cands := make([]scheduling.Candidate, 0, 40)
				costsF, costsG := make([]float64, 40), make([]float64, 40)
				for round := range 3000 {
					req, cs := randomChoice(rng, cands[:0], temps)
					// Costs past the candidates must stay untouched.
					for i := range costsF {
						costsF[i], costsG[i] = -7, -7
					}
					got, err := scheduling.Choose(b, fused, &req, cs, costsF)
					require.NoError(t, err)
					want, err := scheduling.Choose(generic, plain, &req, cs, costsG)
					require.NoError(t, err)
					require.Equal(t, want, got, "round %d: costs %v", round, costsG[:len(cs)])
					for i := range costsF {
						require.Equal(t, math.Float64bits(costsG[i]), math.Float64bits(costsF[i]), "round %d: cost %d", round, i)
					}
				}
				// Both selectors drew the same random numbers.
				require.Equal(t, plain.Select([]float64{1, 1, 1, 1, 1, 1, 1}, scheduling.OptFloat{}), fused.Select([]float64{1, 1, 1, 1, 1, 1, 1}, scheduling.OptFloat{}))
			}
		})
	}
}

// randomChoice returns a random request and 1 to 40 candidates drawn from
// few distinct values, so that equal costs and loads are common.
func randomChoice(rng *rand.Rand, cands []scheduling.Candidate, temps []scheduling.OptFloat) (scheduling.Request, []scheduling.Candidate) {
	blocks := rng.IntN(80)
	req := scheduling.Request{PromptTokens: blocks*16 + rng.IntN(16), Blocks: blocks}
	if rng.IntN(3) == 0 {
		req.BlockSize = 16
	}
	if rng.IntN(3) == 0 {
		req.ExpectedOutputTokens = rng.IntN(500)
	}
	if rng.IntN(4) == 0 {
		req.Overrides.OverlapWeight = scheduling.Float(float64(rng.IntN(4)) - 1)
		req.Overrides.PrefillLoadScale = scheduling.Float(float64(rng.IntN(20)))
	}
	req.Overrides.Temperature = temps[rng.IntN(len(temps))]
	n := 1 + rng.IntN(40)
	if rng.IntN(4) == 0 {
		n = 1 + rng.IntN(3)
	}
	idle := rng.IntN(2) == 0 // most workers idle, as in a steady stream
	for i := range n {
		c := scheduling.Candidate{Worker: kvroute.WorkerKey{ID: kvroute.WorkerID(i)}}
		if rng.IntN(4) == 0 {
			c.Cached[rng.IntN(kvroute.NumTiers)] = rng.IntN(blocks + 1)
		}
		if rng.IntN(8) == 0 {
			c.OverlapDiscount = float64(rng.IntN(3)) / 2
		}
		if !idle || rng.IntN(4) == 0 {
			c.Load.ActiveRequests = rng.IntN(5)
			c.Load.ActivePrefillTokens = 16 * rng.IntN(3)
			c.Load.ActiveDecodeBlocks = 10 * rng.IntN(4)
		}
		c.Load.PotentialDecodeBlocks = c.Load.ActiveDecodeBlocks + blocks - rng.IntN(blocks+1)*rng.IntN(2)
		if rng.IntN(5) == 0 {
			c.Load.KVCapacityBlocks = 20 + rng.IntN(100)
		}
		cands = append(cands, c)
	}
	return req, cands
}
