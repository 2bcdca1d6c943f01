package scheduling

import (
	"fmt"
	"math"
)

// Choose scores cands with cost into costs and returns the index of the
// candidate sel picks, honouring req.Overrides.Temperature. costs must be
// at least as long as cands; Choose allocates nothing. It returns
// ErrNoCandidates for empty cands and an error wrapping ErrInvalidRequest
// when costs is too short.
//
// For kvroute's default cost (a BoundedLoad around a DynamoCost, as
// NewDefaultCost makes) it computes the costs, the load bound and the
// choice in two passes over the candidates instead of four or five; the
// costs and the choice are those of cost.Costs followed by sel.Select, bit
// for bit and draw for draw.
func Choose(cost CostFunc, sel *Selector, req *Request, cands []Candidate, costs []float64) (int, error) {
	if len(cands) == 0 {
		return -1, ErrNoCandidates
	}
	if len(costs) < len(cands) {
		return -1, fmt.Errorf("%w: %d costs for %d candidates", ErrInvalidRequest, len(costs), len(cands))
	}
	costs = costs[:len(cands)]
	if b, ok := cost.(*BoundedLoad); ok {
		if d, ok := b.inner.(*DynamoCost); ok {
			return chooseBoundedDynamo(b, d, sel, req, cands, costs), nil
		}
	}
	cost.Costs(req, cands, costs)
	return sel.Select(costs, req.Overrides.Temperature), nil
}

// chooseBoundedDynamo is Choose for a BoundedLoad b around the DynamoCost
// d, for non-empty cands and costs of the same length: one pass for the
// costs and the load bound, a second that adds the over-bound penalty and
// finds the costs' minimum, its ties and the largest finite cost, then the
// selector's choice from these, which at temperature 0 with a single
// minimum needs no further pass.
func chooseBoundedDynamo(b *BoundedLoad, d *DynamoCost, sel *Selector, req *Request, cands []Candidate, costs []float64) int {
	p := d.params(req)
	n := len(cands)
	if n == 1 {
		d.costs(&p, req, cands, costs, nil) // BoundedLoad leaves one candidate alone
		return 0
	}
	total, least, r := d.costs(&p, req, cands, costs, b)
	bound := b.boundOf(n, total, least, r)
	maxWithin, minOver := 0.0, math.Inf(1)
	lo, hi, ties, first := math.Inf(1), math.Inf(-1), 0, -1
	for i := range cands {
		v := costs[i]
		if _, with, _ := b.loads(req, &cands[i]); with > bound {
			if v < minOver {
				minOver = v
			}
			v += overBound
			costs[i] = v
		} else if v > maxWithin {
			maxWithin = v
		}
		v = costOf(v)
		switch {
		case v < lo:
			lo, ties, first = v, 1, i
		case v == lo:
			ties++
		}
		if v > hi && !math.IsInf(v, 1) {
			hi = v
		}
	}
	if extra := extraPenalty(maxWithin, minOver); extra > 0 {
		// Costs so large (a request's overrides) that overBound does not
		// clear them: the rare second pass, then the selector's own scan.
		for i := range cands {
			if _, with, _ := b.loads(req, &cands[i]); with > bound {
				costs[i] += extra
			}
		}
		return sel.Select(costs, req.Overrides.Temperature)
	}
	return sel.pick(costs, or(req.Overrides.Temperature, sel.temperature), lo, hi, ties, first)
}
