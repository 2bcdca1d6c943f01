package bench

import (
	"fmt"
	"math"

	"github.com/kvroute/kvroute/scheduling"
)

// KVPressure wraps a cost function with a cost on the share of a worker's
// KV cache its active requests would hold with the request:
//
//	cost += Weight · PotentialDecodeBlocks / KVCapacityBlocks
//
// (nothing for a worker whose capacity is unknown). A request whose prefix
// is already active on a worker adds only its own blocks there
// (Load.PotentialDecodeBlocks), so requests that share a prefix in flight
// gather at little cost, while a worker holding many distinct prompts in
// flight costs more. The decode step of an engine grows with the KV its
// batch reads, in proportion to the cache it fills: with prompts a large
// share of the cache, one more distinct prompt in flight slows every
// request of the worker, and Weight then outweighs the prefill a cache hit
// saves; with prompts a small share of a large cache, the term is small
// beside the wrapped cost. KVPressure is immutable and safe for concurrent
// use.
type KVPressure struct {
	inner  scheduling.CostFunc
	weight float64
}

// NewKVPressure returns a KVPressure around inner. It returns an error
// wrapping ErrInvalidConfig when inner is nil or weight is negative or not
// finite.
func NewKVPressure(inner scheduling.CostFunc, weight float64) (*KVPressure, error) {
	switch {
	case inner == nil:
		return nil, fmt.Errorf("%w: nil inner cost function", ErrInvalidConfig)
	case !(weight >= 0) || math.IsInf(weight, 0):
		return nil, fmt.Errorf("%w: kv pressure weight %v", ErrInvalidConfig, weight)
	}
	return &KVPressure{inner: inner, weight: weight}, nil
}

// Costs implements scheduling.CostFunc.
func (k *KVPressure) Costs(req *scheduling.Request, cands []scheduling.Candidate, costs []float64) {
	k.inner.Costs(req, cands, costs)
	n := min(len(cands), len(costs))
	for i := range n {
		l := &cands[i].Load
		if l.KVCapacityBlocks > 0 && l.PotentialDecodeBlocks > 0 {
			costs[i] += k.weight * float64(l.PotentialDecodeBlocks) / float64(l.KVCapacityBlocks)
		}
	}
}
