package scheduling

import (
	"fmt"
	"math"
)

// DefaultLoadBoundFactor is BoundedLoadConfig.Factor's default: no worker
// holds more than half as much again as its fair share of the requests in
// flight (rounded up).
const DefaultLoadBoundFactor = 1.5

// overBound is what BoundedLoad adds to the cost of a candidate over the
// bound: more than any cost of this package, finite so that the order among
// candidates over the bound still follows their costs.
const overBound = 1e15

// BoundedLoadConfig configures BoundedLoad.
type BoundedLoadConfig struct {
	// Factor bounds a worker's share of the active requests of all
	// candidates, the request being routed included, at Factor times the
	// mean. Zero means
	// DefaultLoadBoundFactor; values below 1 are invalid (no worker could
	// take the request).
	Factor float64
}

// BoundedLoad wraps a CostFunc with a cap on each worker's load, in the
// manner of consistent hashing with bounded loads: the candidates are
// ranked by the wrapped cost, but a candidate that would hold more than
//
//	bound = ⌈Factor · (Σ ActiveRequests + 1) / candidates⌉
//
// active requests with the request is ranked after every candidate within
// the bound. ActiveRequests is what the router tracks of its own requests
// (merged with the engine's report, see router), queued ones included, so
// QueueDepth, which an engine reports for the same requests, is not added. A cache-affine cost can then
// weigh the cache strongly (send a prompt where its prefix is) without
// piling a hot prefix onto one worker: when its holder reaches the bound,
// the request goes to the best other worker, which then caches the prefix
// too. With Factor ≥ 1 some candidate is always within the bound (the least
// busy one). BoundedLoad is immutable and safe for concurrent use.
type BoundedLoad struct {
	inner  CostFunc
	factor float64
}

// NewBoundedLoad returns a BoundedLoad around inner. It returns an error
// wrapping ErrInvalidConfig when inner is nil or the factor is below 1 or
// not finite.
func NewBoundedLoad(inner CostFunc, cfg BoundedLoadConfig) (*BoundedLoad, error) {
	if inner == nil {
		return nil, fmt.Errorf("%w: nil inner cost function", ErrInvalidConfig)
	}
	f := cfg.Factor
	if f == 0 {
		f = DefaultLoadBoundFactor
	}
	if !(f >= 1) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("%w: load bound factor %v", ErrInvalidConfig, cfg.Factor)
	}
	return &BoundedLoad{inner: inner, factor: f}, nil
}

// Costs implements CostFunc.
func (b *BoundedLoad) Costs(req *Request, cands []Candidate, costs []float64) {
	b.inner.Costs(req, cands, costs)
	n := min(len(cands), len(costs))
	if n < 2 {
		return
	}
	total := 0
	for i := range n {
		total += max(cands[i].Load.ActiveRequests, 0)
	}
	bound := int(math.Ceil(b.factor * float64(total+1) / float64(n)))
	for i := range n {
		if max(cands[i].Load.ActiveRequests, 0)+1 > bound {
			costs[i] += overBound
		}
	}
}

// DefaultCostConfig is the cost NewDefaultCost bounds: Dynamo's cost with
// the cache weighed twice as much (OverlapWeight 2), the prefill term
// scaled 16 times (PrefillLoadScale 16) so that the work a request would
// still have to prefill dominates the count of active KV blocks, and 16
// blocks of cost per active request.
var DefaultCostConfig = DynamoCostConfig{
	OverlapWeight:       Float(2),
	PrefillLoadScale:    Float(16),
	ActiveRequestWeight: 16,
}

// NewDefaultCost returns kvroute's default routing cost for workers of the
// given block size (zero means DefaultBlockSize): DynamoCost with
// DefaultCostConfig inside a BoundedLoad with DefaultLoadBoundFactor.
//
// The cache-heavy cost sends each prompt to the worker that already holds
// most of its prefix, so a shared prefix stays on few workers and the
// cluster's caches hold more distinct prefixes (more hits, shorter
// prefills); the load bound keeps any worker from taking more than 1.5
// times its fair share of the requests in flight, so that a hot
// prefix spills to other workers instead of queueing on one, and decode
// throughput stays that of a balanced pool. Measured end to end on NVIDIA
// Dynamo's mocker engines against Dynamo's default KV router: see
// BENCHMARKS.md.
func NewDefaultCost(blockSize int) (*BoundedLoad, error) {
	cfg := DefaultCostConfig
	cfg.BlockSize = blockSize
	inner, err := NewDynamoCost(cfg)
	if err != nil {
		return nil, err
	}
	return NewBoundedLoad(inner, BoundedLoadConfig{})
}
