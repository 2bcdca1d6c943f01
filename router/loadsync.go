package router

import (
	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

// LoadSync receives the load of the requests this router routes, so that
// other router replicas can count it: kvevents/natsx.Replica implements it
// and applies the peers' requests to this router's Tracker, where Select
// sees them next to its own, each request exactly once.
//
// The router calls it after updating its own tracker, on the goroutine of
// Select or of the Decision method, so implementations must be fast, must
// not block and must be safe for concurrent use. ids are the router's own
// tracker ids, unique among its active requests. blocks is only valid
// during the call: a sync that keeps it copies it, and that copy is then
// Select's only allocation.
type LoadSync interface {
	// Added reports a request tracked on worker w (Tracker.Add).
	Added(id scheduling.RequestID, w kvroute.WorkerKey, blocks []kvroute.SeqHash, prefillTokens int)
	// PrefillDone reports that request id finished its prefill.
	PrefillDone(id scheduling.RequestID)
	// OutputTokens reports n more generated tokens of request id.
	OutputTokens(id scheduling.RequestID, n int)
	// Freed reports that request id ended. It is called once per request
	// the router tracked (a disaggregated request's prefill, tracked on
	// its prefill worker, ends at PrefillDone, or at Done without one),
	// also when the tracker had already dropped it.
	Freed(id scheduling.RequestID)
}

// track adds a request of this router to its tracker and reports it to the
// load sync.
func (r *Router) track(id scheduling.RequestID, w kvroute.WorkerKey, blocks []kvroute.SeqHash, prefillTokens int) {
	if r.tracker.Add(id, w, blocks, prefillTokens) == nil && r.loadSync != nil {
		r.loadSync.Added(id, w, blocks, prefillTokens)
	}
}

// untrack frees a request of this router and reports it to the load sync,
// even when the tracker no longer held it (its worker was removed or it
// expired), so that the sync forgets it too. Id 0 is no request.
func (r *Router) untrack(id scheduling.RequestID) {
	if id == 0 {
		return // never tracked, or already untracked (see SelectInto)
	}
	r.tracker.Free(id)
	if r.loadSync != nil {
		r.loadSync.Freed(id)
	}
}

// LoadChanged lets waiting requests look at the loads again after a change
// this router did not make itself, such as peers' requests ending (a
// LoadSync implementation calls it).
func (r *Router) LoadChanged() { r.releaseAll() }
