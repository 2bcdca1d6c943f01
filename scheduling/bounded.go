package scheduling

import (
	"fmt"
	"math"
)

// DefaultLoadBoundFactor is BoundedLoadConfig.Factor's default, the one
// kvroute's default cost (NewDefaultCost) uses: no worker holds more than
// twice its fair share of the requests in flight (rounded up).
const DefaultLoadBoundFactor = 2

// overBound is what BoundedLoad adds, at least, to the cost of a candidate
// over the bound (see penaltyGap): finite, so that the order among
// candidates over the bound still follows their costs.
const overBound = 1e15

// LoadMeasure is what BoundedLoad bounds.
type LoadMeasure uint8

// The load measures of BoundedLoad.
const (
	// MeasureRequests bounds the active requests (Load.ActiveRequests,
	// queued ones included; QueueDepth, which an engine reports for the
	// same requests, is not added).
	MeasureRequests LoadMeasure = iota
	// MeasureKVBlocks bounds the distinct KV blocks a worker's active
	// requests hold, the request being routed included
	// (Load.PotentialDecodeBlocks against Load.ActiveDecodeBlocks): a
	// request that shares its prefix with requests active on a worker adds
	// only its own blocks there, so a shared prefix may gather on one
	// worker while workers that hold distinct prompts stay even. Engines
	// run out of KV memory by these blocks, and the decode step of an
	// engine with prefix caching grows with them.
	MeasureKVBlocks
)

// BoundedLoadConfig configures BoundedLoad.
type BoundedLoadConfig struct {
	// Factor bounds a worker's load at Factor times the mean over the
	// candidates, the request being routed included. Zero means
	// DefaultLoadBoundFactor; values below 1 are invalid.
	Factor float64
	// Measure is the load bounded. The zero value is MeasureRequests.
	Measure LoadMeasure
}

// BoundedLoad wraps a CostFunc with a cap on each worker's load, in the
// manner of consistent hashing with bounded loads: the candidates are
// ranked by the wrapped cost, but a candidate whose load with the request
// would exceed
//
//	bound = ⌈Factor · (Σ load + r) / (candidates · r)⌉ · r
//
// is ranked after every candidate within the bound, where load is the
// measure (Config.Measure) and r what the request adds: one request, or
// its prompt's blocks. The bound is rounded up to whole requests, so that
// an idle pool takes requests on every worker, and the candidate with the
// least load with the request is never over it. A cache-affine cost can
// then weigh the cache strongly (send a prompt where its prefix is)
// without piling a hot prefix, or a sticky conversation, onto one worker:
// when its holder reaches the bound, the request goes to the best other
// worker, which then caches the prefix too. BoundedLoad is immutable and
// safe for concurrent use.
type BoundedLoad struct {
	inner   CostFunc
	factor  float64
	measure LoadMeasure
}

// NewBoundedLoad returns a BoundedLoad around inner. It returns an error
// wrapping ErrInvalidConfig when inner is nil, the factor is below 1 or
// not finite, or the measure unknown.
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
	if cfg.Measure > MeasureKVBlocks {
		return nil, fmt.Errorf("%w: load measure %d", ErrInvalidConfig, cfg.Measure)
	}
	return &BoundedLoad{inner: inner, factor: f, measure: cfg.Measure}, nil
}

// loads returns candidate c's load now and with the request, and what the
// request adds to the total.
func (b *BoundedLoad) loads(req *Request, c *Candidate) (now, with, adds int) {
	if b.measure == MeasureKVBlocks && req.Blocks > 0 {
		now = max(c.Load.ActiveDecodeBlocks, 0)
		return now, max(c.Load.PotentialDecodeBlocks, now), req.Blocks
	}
	now = max(c.Load.ActiveRequests, 0)
	return now, now + 1, 1
}

// Costs implements CostFunc.
func (b *BoundedLoad) Costs(req *Request, cands []Candidate, costs []float64) {
	b.inner.Costs(req, cands, costs)
	n := min(len(cands), len(costs))
	if n < 2 {
		return
	}
	bound := b.bound(req, cands[:n])
	maxWithin, minOver := 0.0, math.Inf(1)
	for i := range n {
		if _, with, _ := b.loads(req, &cands[i]); with > bound {
			minOver = min(minOver, costOf(costs[i]))
			costs[i] += overBound
		} else if c := costs[i]; c > maxWithin {
			maxWithin = c
		}
	}
	if extra := extraPenalty(maxWithin, minOver); extra > 0 {
		for i := range n {
			if _, with, _ := b.loads(req, &cands[i]); with > bound {
				costs[i] += extra
			}
		}
	}
}

// extraPenalty returns what BoundedLoad adds beyond overBound to the costs
// of candidates over the bound, given the largest finite cost within the
// bound and the least cost over it, so that each exceeds every cost within
// the bound and their own order stays: nothing, unless a request's weight
// overrides scale costs far beyond overBound; then twice the gap (at costs
// so large that adding overBound is lost to rounding, the sum still clears
// the largest cost within the bound).
func extraPenalty(maxWithin, minOver float64) float64 {
	gap := maxWithin - minOver
	if !(gap >= overBound/2) || math.IsInf(gap, 0) {
		return 0
	}
	return 2 * gap
}

// bound returns the load bound over cands: a candidate whose load with
// the request exceeds it is over the bound.
func (b *BoundedLoad) bound(req *Request, cands []Candidate) int {
	total, least, r := 0, math.MaxInt, 1
	for i := range cands {
		now, with, adds := b.loads(req, &cands[i])
		total += now
		least = min(least, with)
		r = adds
	}
	return b.boundOf(len(cands), total, least, r)
}

// boundOf returns the load bound over n candidates whose loads sum to
// total, the least load with the request being least, for a request that
// adds r.
func (b *BoundedLoad) boundOf(n, total, least, r int) int {
	f := math.Ceil(b.factor*float64(total+r)/float64(n*r)) * float64(r)
	if !(f < math.MaxInt/2) {
		return math.MaxInt // a factor so large it bounds nothing
	}
	return max(int(f), least)
}

// DefaultCostConfig returns the cost NewDefaultCost bounds: Dynamo's cost with
// the cache weighed twice as much (OverlapWeight 2), the prefill term
// scaled 16 times (PrefillLoadScale 16) so that the work a request would
// still have to prefill dominates the count of active KV blocks, 16
// blocks of cost per active request, and a KV-pressure term of 8,000
// blocks for a worker's whole KV cache held in flight (KVPressureWeight:
// at 800 blocks per worker one distinct block in flight costs 10, at
// 32,768 a quarter).
func DefaultCostConfig() DynamoCostConfig {
	return DynamoCostConfig{
		OverlapWeight:       Float(2),
		PrefillLoadScale:    Float(16),
		ActiveRequestWeight: 16,
		KVPressureWeight:    8000,
	}
}

// NewDefaultCost returns kvroute's default routing cost for workers of the
// given block size (zero means DefaultBlockSize): DynamoCost with
// DefaultCostConfig() inside a BoundedLoad on requests with
// DefaultLoadBoundFactor (2).
//
// The cache-heavy cost sends each prompt to the worker that already holds
// most of its prefix, so a shared prefix stays on few workers and the
// cluster's caches hold more distinct prefixes (more hits, shorter
// prefills); the KV-pressure term keeps a worker from gathering many
// distinct prompts in flight, whose KV would slow the decode of all its
// requests, while requests that share a prefix in flight gather at little
// cost; the load bound keeps any worker from taking more than twice its
// fair share of the requests in flight, so that a hot prefix spills to
// other workers instead of queueing on one. Measured end to end on NVIDIA
// Dynamo's mocker engines against Dynamo's default KV router: see
// BENCHMARKS.md.
func NewDefaultCost(blockSize int) (*BoundedLoad, error) {
	cfg := DefaultCostConfig()
	cfg.BlockSize = blockSize
	inner, err := NewDynamoCost(cfg)
	if err != nil {
		return nil, err
	}
	return NewBoundedLoad(inner, BoundedLoadConfig{})
}
