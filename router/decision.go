package router

import (
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

// Request is a request to route.
type Request struct {
	// Tokens are the prompt's token ids. The router does not retain them.
	Tokens []uint32
	// LoRA is the LoRA adapter the request uses, empty for the base model.
	LoRA string
	// CacheSalt is the request's cache salt (vLLM's and SGLang's
	// cache_salt), empty for none: its blocks are hashed under
	// kvroute.Hasher.WithSalt, as the engines' events for it are, so that
	// it shares cached blocks only with requests of the same salt.
	CacheSalt string
	// MM lists the prompt's multimodal items with their placeholder token
	// ranges (see kvroute.MMObject and kvroute.MMIdentifierHash): blocks
	// they overlap are hashed with them, so that prompts whose placeholder
	// tokens are equal but whose images differ do not match.
	MM []kvroute.MMObject
	// Priority is the strict priority class in the admission queue.
	Priority uint32
	// PriorityJump moves the request ahead inside its class (see
	// scheduling.Request).
	PriorityJump float64
	// ExpectedOutputTokens is the expected output length, zero if unknown.
	ExpectedOutputTokens int
	// Pin, when HasPin is set, sends the request to this cache domain and
	// no other; Select fails with ErrPinnedUnavailable when it cannot.
	Pin    kvroute.WorkerKey
	HasPin bool
	// Admitted, with HasPin, says the request already runs on Pin (a
	// proxy sent it there, such as a fallback after the worker chosen
	// first failed): Select only starts tracking it there, past the busy
	// thresholds and the admission queue, which would refuse or hold
	// work that is no longer the router's to admit.
	Admitted bool
	// Exclude lists cache domains not to choose, such as workers a retry
	// already failed on. Excluding every candidate gives ErrNoWorkers.
	Exclude []kvroute.WorkerKey
	// SessionKey, when not empty, keeps a session on the worker that served
	// its previous request while that worker is healthy and not busy, for
	// SessionTTL (Config) or the request's own SessionTTL after the last
	// request.
	SessionKey string
	SessionTTL time.Duration
	// Overrides replace cost weights and the temperature for this request.
	Overrides scheduling.Overrides
	// Explain fills Decision.Candidates with every candidate's overlap and
	// cost. It costs an allocation per decision; leave it off on hot paths.
	Explain bool
}

// Transfer is the KV-block movement a disaggregated decision needs: the
// prefill worker computes the prompt and the decode worker pulls the
// blocks it does not hold yet.
type Transfer struct {
	From kvroute.WorkerKey // the prefill worker
	To   kvroute.WorkerKey // the decode worker
	// FirstBlock is the index of the first prompt block to move: the decode
	// worker already holds the blocks before it.
	FirstBlock int
	// Blocks is the number of blocks to move.
	Blocks int
}

// CandidateCost is one candidate of a decision, for debugging.
type CandidateCost struct {
	Worker kvroute.WorkerKey
	Cached [kvroute.NumTiers]int
	Load   scheduling.Load
	Health Health
	Cost   float64
}

// Outcome is how a routed request ended.
type Outcome struct {
	// Err is the request's error, nil when it succeeded. A success clears
	// the worker's consecutive errors; a non-nil error counts as one more,
	// and in Stats.Failures, unless it wraps context.Canceled (the client
	// went away, which is not the worker's fault) or ErrNoVerdict (an end
	// that says nothing of the worker's health), which do neither.
	Err error
	// CachedTokens is the number of prompt tokens the engine actually found
	// in its cache (vLLM's num_cached_tokens), valid when CachedTokensKnown.
	CachedTokens      int
	CachedTokensKnown bool
}

// Decision is the router's answer for one request and the handle of its
// lifecycle. Every Decision returned by Select must be balanced by exactly
// one Done; PrefillDone and AddOutputTokens are optional but keep the
// load tracker exact. All three are safe from any goroutine and harmless
// when repeated or called after Done. A Decision whose Done is never called
// stops counting as load after the tracker's TTL.
//
// A Decision filled by SelectInto may be reused for another SelectInto once
// its Done has been called and no goroutine uses it any more (a late
// PrefillDone on a reused Decision would act on the new request).
type Decision struct {
	// Worker is the chosen cache domain: the worker that serves the request
	// (the decode worker when Disaggregated).
	Worker kvroute.WorkerKey
	// Disaggregated is set when the request is served by a prefill worker
	// and a decode worker; Prefill and Transfer then say which and what
	// moves.
	Disaggregated bool
	Prefill       kvroute.WorkerKey
	Transfer      Transfer
	// PromptTokens and Blocks are the prompt's length in tokens and full
	// blocks.
	PromptTokens int
	Blocks       int
	// CachedBlocks and CachedTokens are the prefix the index says the
	// serving worker (the prefill worker when Disaggregated) holds.
	CachedBlocks int
	CachedTokens int
	// Cost is the chosen candidate's cost.
	Cost float64
	// Candidates lists every candidate with its cost, when Request.Explain
	// was set.
	Candidates []CandidateCost
	// Waited is the time the request spent in the admission queue.
	Waited time.Duration

	r         *Router
	id        scheduling.RequestID // tracker id on Worker, 0 when not tracked
	prefillID scheduling.RequestID // tracker id on Prefill when Disaggregated, 0 when not tracked
	// serving and prefill are the incarnations of Worker and Prefill the
	// decision was made for: a worker removed and added again under the
	// same id is a new one, which the decision's outcome does not concern.
	serving, prefill *domainState
	state            atomic.Uint32
	stripe           uint8 // stripe of the router's counters this decision adds to
}

const (
	statePrefillDone = 1 << iota
	stateDone
)

// PrefillDone records that the request's first token arrived: its prefill
// no longer loads the worker (and, disaggregated, the prefill worker is
// done with it). Waiting requests may be admitted.
func (d *Decision) PrefillDone() {
	if d == nil || d.r == nil {
		return
	}
	for {
		s := d.state.Load()
		if s&(statePrefillDone|stateDone) != 0 {
			return
		}
		if d.state.CompareAndSwap(s, s|statePrefillDone) {
			break
		}
	}
	r := d.r
	if d.id != 0 && r.tracker.PrefillDone(d.id) && r.loadSync != nil {
		r.loadSync.PrefillDone(d.id)
	}
	if d.Disaggregated {
		r.untrack(d.prefillID)
	}
	r.release()
}

// AddOutputTokens records n more generated tokens, which grow the request's
// decode blocks. It does nothing after Done.
func (d *Decision) AddOutputTokens(n int) {
	if d == nil || d.r == nil || d.id == 0 || d.state.Load()&stateDone != 0 {
		return
	}
	if d.r.tracker.AddOutputTokens(d.id, n) && d.r.loadSync != nil {
		d.r.loadSync.OutputTokens(d.id, n)
	}
}

// Done ends the request: its load is released, its outcome feeds routing
// accuracy and worker health. Only the first call counts. The outcome
// counts toward the health of the worker the decision was made for only
// while that worker stays registered: once it was removed (RemoveWorker,
// PurgeWorker), even if added again under its id since, it concerns a
// worker that is no longer there.
func (d *Decision) Done(o Outcome) {
	if d == nil || d.r == nil {
		return
	}
	var s uint32
	for {
		s = d.state.Load()
		if s&stateDone != 0 {
			return
		}
		if d.state.CompareAndSwap(s, s|stateDone) {
			break
		}
	}
	r := d.r
	r.untrack(d.id)
	if d.Disaggregated && s&statePrefillDone == 0 {
		r.untrack(d.prefillID) // else PrefillDone ended it
	}
	r.observe(d, o)
	r.release()
}

// release admits the best waiting request, if the queue is on, when a
// request of this router frees load. A released request that finds room
// releases the next one once its own load is tracked (SelectInto), so the
// queue admits as many requests as the freed capacity holds, in order,
// while one that finds the workers saturated again waits again in its
// place.
func (r *Router) release() {
	if r.queue != nil {
		r.queue.Release(1) // counted even with nobody waiting (Item.Releases)
	}
}

// releaseAll lets every waiting request look at the loads again, after a
// change this router did not cause (a load report, expiry, a worker added
// or recovered); those still facing saturated workers wait again, keeping
// their place.
func (r *Router) releaseAll() {
	if r.queue != nil {
		r.queue.Release(r.queue.Len())
	}
}
