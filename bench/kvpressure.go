package bench

import (
	"fmt"
	"math"

	"github.com/kvroute/kvroute/scheduling"
)

// KVPressureMeasure is what KVPressure charges for.
type KVPressureMeasure uint8

// The measures of KVPressure.
const (
	// KVPressureHeld charges the KV blocks a worker's active requests would
	// hold with the request, distinct (Load.PotentialDecodeBlocks), over
	// its capacity.
	KVPressureHeld KVPressureMeasure = iota
	// KVPressureAdded charges the blocks the request adds to the worker's
	// active KV (Load.PotentialDecodeBlocks − Load.ActiveDecodeBlocks: none
	// of the prefix already in flight there), times the requests whose
	// decode they slow (the worker's active requests and the request
	// itself), over its capacity. Engine load reports that count more
	// active blocks than the router's tracker raise both of those loads
	// alike, so the blocks added are the router's own view.
	KVPressureAdded
)

// KVPressureConfig configures KVPressure.
type KVPressureConfig struct {
	// Weight is the cost, in the wrapped cost's units, of a worker's whole
	// KV cache. Negative or non-finite values are invalid.
	Weight float64
	// Measure is what is charged; the zero value is KVPressureHeld.
	Measure KVPressureMeasure
}

// KVPressure wraps a cost function with a cost on the KV cache a worker's
// requests in flight would hold with the request, as a share of the
// worker's capacity. The held measure is the term kvroute's default cost
// now carries itself (scheduling.DynamoCostConfig.KVPressureWeight, 8,000
// in scheduling.DefaultCostConfig), which the candidates use; the wrapper
// stays for the added measure and to compare the two forms:
//
//	held:  cost += Weight · PotentialDecodeBlocks / KVCapacityBlocks
//	added: cost += Weight · (PotentialDecodeBlocks − ActiveDecodeBlocks) · (ActiveRequests + 1) / KVCapacityBlocks
//
// (nothing for a worker whose capacity is unknown). A request whose prefix
// is already active on a worker adds only its own blocks there, so requests
// that share a prefix in flight gather at little cost, while a worker
// holding many distinct prompts in flight costs more. The decode step of an
// engine grows with the KV its batch reads, in proportion to the cache it
// fills: with prompts a large share of the cache, one more distinct prompt
// in flight slows every request of the worker, and Weight then outweighs
// the prefill a cache hit saves; with prompts a small share of a large
// cache, the term is small beside the wrapped cost. KVPressure is immutable
// and safe for concurrent use.
type KVPressure struct {
	inner   scheduling.CostFunc
	weight  float64
	measure KVPressureMeasure
}

// NewKVPressure returns a KVPressure around inner. It returns an error
// wrapping ErrInvalidConfig when inner is nil, the weight is negative or
// not finite, or the measure unknown.
func NewKVPressure(inner scheduling.CostFunc, cfg KVPressureConfig) (*KVPressure, error) {
	switch {
	case inner == nil:
		return nil, fmt.Errorf("%w: nil inner cost function", ErrInvalidConfig)
	case !(cfg.Weight >= 0) || math.IsInf(cfg.Weight, 0):
		return nil, fmt.Errorf("%w: kv pressure weight %v", ErrInvalidConfig, cfg.Weight)
	case cfg.Measure > KVPressureAdded:
		return nil, fmt.Errorf("%w: kv pressure measure %d", ErrInvalidConfig, cfg.Measure)
	}
	return &KVPressure{inner: inner, weight: cfg.Weight, measure: cfg.Measure}, nil
}

// Costs implements scheduling.CostFunc.
func (k *KVPressure) Costs(req *scheduling.Request, cands []scheduling.Candidate, costs []float64) {
	k.inner.Costs(req, cands, costs)
	n := min(len(cands), len(costs))
	for i := range n {
		l := &cands[i].Load
		if l.KVCapacityBlocks <= 0 {
			continue
		}
		var blocks float64
		if k.measure == KVPressureAdded {
			blocks = float64(max(l.PotentialDecodeBlocks-l.ActiveDecodeBlocks, 0)) * float64(max(l.ActiveRequests, 0)+1)
		} else {
			blocks = float64(max(l.PotentialDecodeBlocks, 0))
		}
		costs[i] += k.weight * blocks / float64(l.KVCapacityBlocks)
	}
}
