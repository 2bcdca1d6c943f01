package scheduling

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync/atomic"
)

// SelectorConfig configures a Selector.
type SelectorConfig struct {
	// Temperature is the default softmax temperature. Zero selects the
	// cheapest candidate (argmin); larger values spread requests over more
	// candidates.
	Temperature float64
	// Seed seeds the random choices (tie-breaks and softmax draws), for
	// reproducible tests and simulations. Zero means a random seed.
	Seed uint64
}

// Selector turns costs into a choice.
//
// At temperature 0 it returns the index of the lowest cost; among exact
// ties it picks uniformly at random, so equal workers share requests
// instead of the first one getting them all. At temperature T > 0 it
// samples from a softmax over range-normalised costs,
//
//	p_i ∝ exp(−(c_i − c_min) / ((c_max − c_min) · T)),
//
// which is uniform when all costs are equal. Costs that are NaN count as
// +Inf, and +Inf costs are only chosen when every cost is +Inf. A −Inf
// cost is a forced choice at any temperature: the selector picks uniformly
// among the −Inf costs.
//
// Its random numbers come from a SplitMix64 generator whose 64-bit state is
// advanced with one atomic add per draw, so a Selector is safe for
// concurrent use without a lock and allocates nothing. With a fixed Seed
// and calls from one goroutine, its choices are reproducible.
type Selector struct {
	temperature float64
	state       atomic.Uint64 // SplitMix64 state; each draw adds splitmixGamma
}

// splitmixGamma is SplitMix64's increment, the odd integer closest to
// 2^64 / φ.
const splitmixGamma = 0x9e3779b97f4a7c15

// NewSelector returns a Selector for cfg. It returns an error wrapping
// ErrInvalidConfig when the temperature is negative or not finite.
func NewSelector(cfg SelectorConfig) (*Selector, error) {
	if !(cfg.Temperature >= 0) || math.IsInf(cfg.Temperature, 0) {
		return nil, fmt.Errorf("%w: temperature %v", ErrInvalidConfig, cfg.Temperature)
	}
	s := &Selector{temperature: cfg.Temperature}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	s.state.Store(seed)
	return s, nil
}

// Temperature returns the configured default temperature.
func (s *Selector) Temperature() float64 { return s.temperature }

// Select returns the index of the chosen cost, or -1 when costs is empty.
// temperature overrides the configured one when set (pass
// Request.Overrides.Temperature); a set value that is negative or not
// finite is ignored.
func (s *Selector) Select(costs []float64, temperature OptFloat) int {
	n := len(costs)
	switch n {
	case 0:
		return -1
	case 1:
		return 0
	}
	t := or(temperature, s.temperature)
	// One pass: the minimum, how often it occurs, and the largest finite cost.
	lo, hi, ties := math.Inf(1), math.Inf(-1), 0
	for _, c := range costs {
		c = costOf(c)
		switch {
		case c < lo:
			lo, ties = c, 1
		case c == lo:
			ties++
		}
		if c > hi && !math.IsInf(c, 1) {
			hi = c
		}
	}
	// A −Inf cost is a must-pick (softmax weights would be NaN): choose
	// among the −Inf costs, as among any minimum ties.
	return s.pick(costs, t, lo, hi, ties, -1)
}

// pick returns the chosen index among costs, given the temperature t and,
// over costs mapped by costOf, the minimum lo, the largest finite cost hi
// and the number ties of costs equal to lo. first is the index of the
// first cost equal to lo when the caller knows it, and -1 otherwise.
func (s *Selector) pick(costs []float64, t, lo, hi float64, ties, first int) int {
	n := len(costs)
	if t == 0 || ties == n || math.IsInf(lo, 0) || hi == lo {
		if ties == 1 && first >= 0 {
			return first // what nthMin returns, without the scan
		}
		return s.nthMin(costs, lo, ties)
	}
	scale := 1 / ((hi - lo) * t)
	if math.IsInf(scale, 0) || scale == 0 || scale != scale {
		// A temperature so low, or a spread of costs so wide, that the
		// weights are not numbers: the limit is the cheapest candidate.
		return s.nthMin(costs, lo, ties)
	}
	var sum float64
	for _, c := range costs {
		sum += softmaxWeight(costOf(c), lo, scale)
	}
	if !(sum > 0) || math.IsInf(sum, 0) {
		return s.nthMin(costs, lo, ties)
	}
	u := s.float64() * sum
	last := 0
	var acc float64
	for i, c := range costs {
		w := softmaxWeight(costOf(c), lo, scale)
		if w == 0 {
			continue
		}
		acc += w
		last = i
		if u < acc {
			return i
		}
	}
	return last
}

// nthMin returns a uniformly random index among the ties costs equal to lo.
func (s *Selector) nthMin(costs []float64, lo float64, ties int) int {
	k := 0
	if ties > 1 {
		k = s.intn(ties)
	}
	for i, c := range costs {
		if costOf(c) == lo {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return 0
}

// costOf maps NaN to +Inf.
func costOf(c float64) float64 {
	if c != c {
		return math.Inf(1)
	}
	return c
}

// softmaxWeight is exp(−(c − lo) · scale), and 0 for an infinite cost.
func softmaxWeight(c, lo, scale float64) float64 {
	if math.IsInf(c, 1) {
		return 0
	}
	return math.Exp(-(c - lo) * scale)
}

// uint64 returns the next SplitMix64 output.
func (s *Selector) uint64() uint64 {
	z := s.state.Add(splitmixGamma)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn returns a uniform integer in [0, n) by multiply-shift (Lemire); the
// bias is below n / 2^64 and does not matter here.
func (s *Selector) intn(n int) int {
	hi, _ := bits.Mul64(s.uint64(), uint64(n))
	return int(hi)
}

// float64 returns a uniform float in [0, 1).
func (s *Selector) float64() float64 {
	return float64(s.uint64()>>11) * 0x1p-53
}
