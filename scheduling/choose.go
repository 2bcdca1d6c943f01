package scheduling

import "fmt"

// Choose scores cands with cost into costs and returns the index of the
// candidate sel picks, honouring req.Overrides.Temperature. costs must be
// at least as long as cands; Choose allocates nothing. It returns
// ErrNoCandidates for empty cands and an error wrapping ErrInvalidRequest
// when costs is too short.
func Choose(cost CostFunc, sel *Selector, req *Request, cands []Candidate, costs []float64) (int, error) {
	if len(cands) == 0 {
		return -1, ErrNoCandidates
	}
	if len(costs) < len(cands) {
		return -1, fmt.Errorf("%w: %d costs for %d candidates", ErrInvalidRequest, len(costs), len(cands))
	}
	costs = costs[:len(cands)]
	cost.Costs(req, cands, costs)
	return sel.Select(costs, req.Overrides.Temperature), nil
}
