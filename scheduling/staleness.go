package scheduling

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute"
)

// DefaultUpdateInterval is the expected interval between a worker's index
// updates when StalenessConfig leaves it zero.
const DefaultUpdateInterval = time.Second

// StalenessConfig configures StalenessCost.
type StalenessConfig struct {
	// Interval is how often a healthy worker is expected to update the
	// index (publish KV events). Zero means DefaultUpdateInterval.
	Interval time.Duration
	// Clock supplies the current time. Nil means kvroute.SystemClock.
	Clock kvroute.Clock
}

// StalenessCost wraps a CostFunc and discounts the cache of workers whose
// index entries may be stale. A worker whose last index update is older
// than the expected interval may have evicted what the index says it
// holds, so its cached blocks count for less:
//
//	staleness = max(0, now − LastUpdate − Interval)
//	freshness = max(0, 1 − staleness / (3 · Interval))
//
// Before calling the wrapped CostFunc it sets each candidate's
// OverlapDiscount to max(OverlapDiscount, 1 − freshness), which every cost
// function in this package honours. Candidates with a zero LastUpdate are
// not discounted. It reads the clock once per call. StalenessCost is
// immutable and safe for concurrent use.
type StalenessCost struct {
	inner    CostFunc
	interval time.Duration
	clock    kvroute.Clock
}

// NewStalenessCost returns a StalenessCost around inner. It returns an
// error wrapping ErrInvalidConfig when inner is nil or the interval is
// negative.
func NewStalenessCost(inner CostFunc, cfg StalenessConfig) (*StalenessCost, error) {
	if inner == nil {
		return nil, fmt.Errorf("%w: nil inner cost function", ErrInvalidConfig)
	}
	if cfg.Interval < 0 {
		return nil, fmt.Errorf("%w: update interval %v", ErrInvalidConfig, cfg.Interval)
	}
	iv := cfg.Interval
	if iv == 0 {
		iv = DefaultUpdateInterval
	}
	return &StalenessCost{inner: inner, interval: iv, clock: kvroute.ClockOrSystem(cfg.Clock)}, nil
}

// Costs implements CostFunc. It writes OverlapDiscount into cands.
func (s *StalenessCost) Costs(req *Request, cands []Candidate, costs []float64) {
	now := s.clock.Now()
	for i := range cands {
		c := &cands[i]
		if c.LastUpdate.IsZero() {
			continue
		}
		if d := 1 - Freshness(now.Sub(c.LastUpdate), s.interval); d > c.OverlapDiscount {
			c.OverlapDiscount = d
		}
	}
	s.inner.Costs(req, cands, costs)
}

// Freshness returns how far an index entry of the given age can be
// trusted, from 1 (fully) to 0 (not at all), for workers expected to update
// every interval: 1 up to one interval, then falling linearly to 0 at four
// intervals. A non-positive interval yields 1.
func Freshness(age, interval time.Duration) float64 {
	if interval <= 0 {
		return 1
	}
	stale := age - interval
	if stale <= 0 {
		return 1
	}
	return max(0, 1-float64(stale)/(3*float64(interval)))
}
