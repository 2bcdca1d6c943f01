package scheduling_test

import (
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scheduling"
)

func newSelector(t testing.TB, temperature float64, seed uint64) *scheduling.Selector {
	t.Helper()
	s, err := scheduling.NewSelector(scheduling.SelectorConfig{Temperature: temperature, Seed: seed})
	require.NoError(t, err)
	return s
}

// frequencies returns how often each index is selected in n draws.
func frequencies(s *scheduling.Selector, costs []float64, temp scheduling.OptFloat, n int) []float64 {
	counts := make([]float64, len(costs))
	for range n {
		counts[s.Select(costs, temp)]++
	}
	for i := range counts {
		counts[i] /= float64(n)
	}
	return counts
}

func TestSelectorArgmin(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	tests := []struct {
		name  string
		costs []float64
		want  int
	}{
		{"empty", nil, -1},
		{"single", []float64{42}, 0},
		{"lowest wins", []float64{18, 10, 11}, 1},
		{"negative costs", []float64{-0.297, -0.3525}, 1},
		{"NaN is never chosen", []float64{nan, 3, nan}, 1},
		{"infinite cost loses", []float64{inf, 7}, 1},
		{"negative infinity wins", []float64{5, math.Inf(-1), 1}, 1},
	}
	s := newSelector(t, 0, 1)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 20 {
				require.Equal(t, tt.want, s.Select(tt.costs, scheduling.OptFloat{}))
			}
		})
	}
}

func TestSelectorNegativeInfinityAtTemperature(t *testing.T) {
	s := newSelector(t, 1, 3)
	ninf := math.Inf(-1)
	// With a finite maximum the softmax range is infinite: the −Inf costs
	// are forced choices, shared uniformly, never NaN weights.
	got := frequencies(s, []float64{ninf, 3, ninf, 7}, scheduling.OptFloat{}, 20000)
	require.InDelta(t, 0.5, got[0], 0.02)
	require.InDelta(t, 0.5, got[2], 0.02)
	require.Zero(t, got[1]+got[3])
	require.Equal(t, 0, s.Select([]float64{ninf, 3, 5}, scheduling.Float(2)))
}

func TestSelectorTieBreakIsUniform(t *testing.T) {
	s := newSelector(t, 0, 7)
	got := frequencies(s, []float64{5, 1, 3, 1, 1, 9}, scheduling.OptFloat{}, 30000)
	require.Zero(t, got[0]+got[2]+got[5])
	for _, i := range []int{1, 3, 4} {
		require.InDelta(t, 1.0/3, got[i], 0.02, "index %d", i)
	}
	// All infinite or NaN: any of them, uniformly.
	got = frequencies(s, []float64{math.Inf(1), math.NaN()}, scheduling.OptFloat{}, 10000)
	require.InDelta(t, 0.5, got[0], 0.03)
}

func TestSelectorSoftmax(t *testing.T) {
	tests := []struct {
		name  string
		temp  float64
		costs []float64
		want  []float64
	}{
		{
			// Range 1, T 1: p ∝ (1, e^−1).
			name:  "two workers",
			temp:  1,
			costs: []float64{0, 1},
			want:  []float64{1 / (1 + math.Exp(-1)), math.Exp(-1) / (1 + math.Exp(-1))},
		},
		{
			// Costs are range-normalised: (18, 10, 11) → (1, 0, 1/8), T 0.5.
			name:  "seed example at temperature 0.5",
			temp:  0.5,
			costs: []float64{18, 10, 11},
			want:  softmax([]float64{-2, 0, -0.25}),
		},
		{
			name:  "equal costs are uniform",
			temp:  2,
			costs: []float64{4, 4, 4, 4},
			want:  []float64{0.25, 0.25, 0.25, 0.25},
		},
		{
			name:  "infinite costs get no probability",
			temp:  1,
			costs: []float64{math.Inf(1), 0, 1, math.NaN()},
			want:  []float64{0, 1 / (1 + math.Exp(-1)), math.Exp(-1) / (1 + math.Exp(-1)), 0},
		},
		{
			name:  "high temperature flattens",
			temp:  100,
			costs: []float64{0, 1},
			want:  softmax([]float64{0, -0.01}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSelector(t, tt.temp, 3)
			require.InDeltaSlice(t, tt.want, frequencies(s, tt.costs, scheduling.OptFloat{}, 40000), 0.015)
		})
	}
}

// softmax returns exp(x_i) / Σ exp(x_j).
func softmax(x []float64) []float64 {
	var sum float64
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = math.Exp(v)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

func TestSelectorTemperatureOverride(t *testing.T) {
	hot := newSelector(t, 1, 5)
	costs := []float64{0, 1}
	// Temperature 0 for this request: always the argmin.
	require.Equal(t, []float64{1, 0}, frequencies(hot, costs, scheduling.Float(0), 1000))
	cold := newSelector(t, 0, 5)
	require.InDelta(t, 1/(1+math.Exp(-1)), frequencies(cold, costs, scheduling.Float(1), 40000)[0], 0.015)
	// Invalid overrides fall back to the configured temperature.
	require.Equal(t, []float64{1, 0}, frequencies(cold, costs, scheduling.Float(-1), 1000))
	require.Equal(t, []float64{1, 0}, frequencies(cold, costs, scheduling.Float(math.NaN()), 1000))
	require.Equal(t, 1.0, hot.Temperature())
}

func TestSelectorSeedIsReproducible(t *testing.T) {
	a, b := newSelector(t, 1, 99), newSelector(t, 1, 99)
	costs := []float64{3, 1, 4, 1, 5, 9, 2, 6}
	for range 1000 {
		require.Equal(t, a.Select(costs, scheduling.OptFloat{}), b.Select(costs, scheduling.OptFloat{}))
	}
}

func TestSelectorConfigValidation(t *testing.T) {
	for _, temp := range []float64{-0.1, math.NaN(), math.Inf(1)} {
		_, err := scheduling.NewSelector(scheduling.SelectorConfig{Temperature: temp})
		require.ErrorIs(t, err, scheduling.ErrInvalidConfig)
	}
	s, err := scheduling.NewSelector(scheduling.SelectorConfig{})
	require.NoError(t, err)
	require.Equal(t, 1, s.Select([]float64{2, 1}, scheduling.OptFloat{}))
}

func TestSelectorConcurrent(t *testing.T) {
	s := newSelector(t, 0.5, 11)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			costs := []float64{float64(g), 1, 2, 1}
			for range 2000 {
				i := s.Select(costs, scheduling.OptFloat{})
				if i < 0 || i >= len(costs) {
					t.Errorf("index %d out of range", i)
					return
				}
			}
		})
	}
	wg.Wait()
}
