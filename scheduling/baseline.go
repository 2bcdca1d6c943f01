package scheduling

import "sync/atomic"

// Random is the cache-blind random baseline: it gives every candidate the
// same cost, so Selector's uniform tie-break (or its uniform softmax)
// picks one at random. It is stateless and safe for concurrent use.
type Random struct{}

// Costs implements CostFunc.
func (Random) Costs(_ *Request, cands []Candidate, costs []float64) {
	clear(costs[:min(len(cands), len(costs))])
}

// RoundRobin is the cache-blind round-robin baseline: each call gives cost
// 0 to the next candidate position in turn and increasing costs to the
// positions after it, so argmin cycles through the candidates. Hosts that
// keep their candidate order stable get a strict rotation. The zero value
// is ready to use and safe for concurrent use; it must not be copied after
// first use.
type RoundRobin struct {
	next atomic.Uint64 // the call counter; position = counter mod len(cands)
}

// Costs implements CostFunc.
func (r *RoundRobin) Costs(_ *Request, cands []Candidate, costs []float64) {
	n := min(len(cands), len(costs))
	if n == 0 {
		return
	}
	start := int((r.next.Add(1) - 1) % uint64(n))
	for i := range n {
		costs[i] = float64((i - start + n) % n)
	}
}

// LoadMetric selects what LeastLoaded compares.
type LoadMetric uint8

// The load metrics of LeastLoaded.
const (
	// ByActiveRequests compares Load.ActiveRequests + Load.QueueDepth.
	ByActiveRequests LoadMetric = iota
	// ByPrefillTokens compares Load.ActivePrefillTokens.
	ByPrefillTokens
)

// LeastLoaded is the cache-blind least-loaded baseline: the cost is the
// candidate's load by the chosen metric; ties are broken by the Selector.
// It is immutable and safe for concurrent use.
type LeastLoaded struct {
	// By is the load metric; the zero value is ByActiveRequests.
	By LoadMetric
}

// Costs implements CostFunc.
func (l LeastLoaded) Costs(_ *Request, cands []Candidate, costs []float64) {
	n := min(len(cands), len(costs))
	for i := range n {
		if l.By == ByPrefillTokens {
			costs[i] = float64(cands[i].Load.ActivePrefillTokens)
		} else {
			costs[i] = float64(busySlots(&cands[i].Load))
		}
	}
}
