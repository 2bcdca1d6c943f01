package bench

import (
	"fmt"
	"math"

	"github.com/kvroute/kvroute/scheduling"
)

// spreadOver is what SpreadBound adds to the cost of a candidate over its
// cap: more than any cost of package scheduling's cost functions, finite so
// that the candidates over the cap keep their order.
const spreadOver = 1e15

// SpreadBoundConfig configures SpreadBound.
type SpreadBoundConfig struct {
	// Slack is the allowance above the least loaded candidate, as a
	// fraction of the mean load with the request. With
	// scheduling.MeasureRequests, a candidate may take the request while
	// its active requests with it stay less than Slack times the mean
	// ahead of the least loaded candidate's, and always when they are one
	// ahead at most:
	//
	//	with ≤ least + max(1, ⌈Slack · mean⌉ − 1)
	//
	// With scheduling.MeasureKVBlocks, loads are distinct active KV blocks
	// (the request's own included, Load.PotentialDecodeBlocks) and the
	// allowance is max(1.5 · r, Slack · mean − r), r the request's blocks:
	// half a request of tolerance, because prompts differ in length. Zero
	// means 1. Negative or non-finite values are invalid.
	Slack float64
	// Measure is the load compared; the zero value is
	// scheduling.MeasureRequests.
	Measure scheduling.LoadMeasure
	// HolderShare and HolderExtra let a candidate that caches at least
	// HolderShare of the prompt's blocks take HolderExtra requests (or
	// HolderExtra times the request's blocks) more than the cap. Zero
	// HolderExtra (the default) gives holders no extra; HolderShare must
	// then be zero too. HolderShare is in (0, 1].
	HolderShare float64
	HolderExtra int
	// ActiveExtra lets a candidate on which at least HolderShare of the
	// prompt's blocks are active (held by requests in flight: the request
	// would add at most the rest, Load.PotentialDecodeBlocks less
	// Load.ActiveDecodeBlocks) take ActiveExtra requests more than the cap
	// instead of HolderExtra: requests sharing a prefix in flight share
	// its KV blocks, and an engine whose decode step grows with its active
	// KV decodes them for little more than one. Only with
	// scheduling.MeasureRequests; it needs HolderExtra and is at least as
	// large.
	ActiveExtra int
	// IdleFirst, with scheduling.MeasureRequests, tightens the cap while a
	// candidate has no active requests: no candidate may then run more than
	// one request ahead of it, holders included. On engines whose decode
	// step grows with the KV they hold, an idle engine is the most
	// throughput lost.
	IdleFirst bool
}

// SpreadBound wraps a cost function with a cap on how far a worker's load
// may run ahead of the least loaded worker's. Candidates within the cap
// are ranked by the wrapped cost; candidates over it are ranked after all
// of them. It is scheduling.BoundedLoad's idea with an additive instead of
// a multiplicative bound: with a few requests per worker in flight, 1.5
// times the mean still lets a worker take a third request while another is
// idle, and on engines whose decode step slows with every request a worker
// holds, an idle worker next to a worker with three is throughput lost.
// With many requests per worker the cap is near the least loaded worker's
// load plus Slack times the mean. Measured in KV blocks, requests that
// share a prefix already active on a worker add only their own blocks
// there, as they add only those to the engine's decode work. SpreadBound
// is immutable and safe for concurrent use.
type SpreadBound struct {
	inner       scheduling.CostFunc
	slack       float64
	measure     scheduling.LoadMeasure
	holderShare float64
	holderExtra int
	activeExtra int
	idleFirst   bool
}

// NewSpreadBound returns a SpreadBound around inner. It returns an error
// wrapping ErrInvalidConfig when inner is nil or a field of cfg is out of
// range.
func NewSpreadBound(inner scheduling.CostFunc, cfg SpreadBoundConfig) (*SpreadBound, error) {
	switch {
	case inner == nil:
		return nil, fmt.Errorf("%w: nil inner cost function", ErrInvalidConfig)
	case !(cfg.Slack >= 0) || math.IsInf(cfg.Slack, 0):
		return nil, fmt.Errorf("%w: spread slack %v", ErrInvalidConfig, cfg.Slack)
	case cfg.Measure > scheduling.MeasureKVBlocks:
		return nil, fmt.Errorf("%w: load measure %d", ErrInvalidConfig, cfg.Measure)
	case cfg.HolderExtra < 0:
		return nil, fmt.Errorf("%w: holder extra %d", ErrInvalidConfig, cfg.HolderExtra)
	case cfg.HolderExtra > 0 && !(cfg.HolderShare > 0 && cfg.HolderShare <= 1):
		return nil, fmt.Errorf("%w: holder share %v", ErrInvalidConfig, cfg.HolderShare)
	case cfg.HolderExtra == 0 && cfg.HolderShare != 0:
		return nil, fmt.Errorf("%w: holder share %v without holder extra", ErrInvalidConfig, cfg.HolderShare)
	case cfg.IdleFirst && cfg.Measure != scheduling.MeasureRequests:
		return nil, fmt.Errorf("%w: idle-first cap with load measure %d", ErrInvalidConfig, cfg.Measure)
	case cfg.ActiveExtra != 0 && (cfg.ActiveExtra < cfg.HolderExtra || cfg.Measure != scheduling.MeasureRequests):
		return nil, fmt.Errorf("%w: active extra %d (holder extra %d, measure %d)", ErrInvalidConfig, cfg.ActiveExtra, cfg.HolderExtra, cfg.Measure)
	}
	s := cfg.Slack
	if s == 0 {
		s = 1
	}
	return &SpreadBound{inner: inner, slack: s, measure: cfg.Measure, holderShare: cfg.HolderShare, holderExtra: cfg.HolderExtra,
		activeExtra: cfg.ActiveExtra, idleFirst: cfg.IdleFirst}, nil
}

// loads returns candidate c's load now and with the request.
func (s *SpreadBound) loads(req *scheduling.Request, c *scheduling.Candidate) (now, with int) {
	if s.measure == scheduling.MeasureKVBlocks && req.Blocks > 0 {
		now = max(c.Load.ActiveDecodeBlocks, 0)
		return now, max(c.Load.PotentialDecodeBlocks, now)
	}
	now = max(c.Load.ActiveRequests, 0)
	return now, now + 1
}

// Costs implements scheduling.CostFunc.
func (s *SpreadBound) Costs(req *scheduling.Request, cands []scheduling.Candidate, costs []float64) {
	s.inner.Costs(req, cands, costs)
	n := min(len(cands), len(costs))
	if n < 2 {
		return
	}
	total, least := 0, math.MaxInt
	for i := range n {
		now, with := s.loads(req, &cands[i])
		total += now
		least = min(least, with)
	}
	var limit, extra int
	if s.measure == scheduling.MeasureKVBlocks && req.Blocks > 0 {
		r := float64(req.Blocks)
		mean := (float64(total) + r) / float64(n)
		limit = least + int(math.Ceil(max(1.5*r, s.slack*mean-r)))
		extra = s.holderExtra * req.Blocks
	} else {
		mean := float64(total+1) / float64(n)
		limit = least + max(1, int(math.Ceil(s.slack*mean))-1)
		extra = s.holderExtra
		if s.idleFirst && least == 1 {
			limit, extra = least+1, 0
		}
	}
	for i := range n {
		c := &cands[i]
		lim := limit
		if extra > 0 && req.Blocks > 0 {
			share := s.holderShare * float64(req.Blocks)
			switch {
			case s.activeExtra > 0 && c.Load.PotentialDecodeBlocks > 0 &&
				float64(req.Blocks-(c.Load.PotentialDecodeBlocks-c.Load.ActiveDecodeBlocks)) >= share:
				lim += s.activeExtra
			case float64(c.CachedBlocks()) >= share:
				lim += extra
			}
		}
		if _, with := s.loads(req, c); with > lim {
			costs[i] += spreadOver
		}
	}
}
