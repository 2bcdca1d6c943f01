package router

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

// statStripes is the number of stripes of the router's hot counters: a
// power of two above the core counts a router usually runs on, so that
// concurrent decisions mostly add to different cache lines.
const statStripes = 8

// routerStats are the router's counters, updated atomically. The counters
// every decision and every Done update are striped: each Select adds to the
// stripe of its pooled scratch (sync.Pool keeps one per P), so that
// decisions on different cores do not pass the same cache lines back and
// forth; Stats sums the stripes.
type routerStats struct {
	_       [64]byte // keeps the first stripe off the lines of the fields before
	stripes [statStripes]statStripe
}

// statStripe is one stripe of the counters, a whole number of cache lines.
type statStripe struct {
	statCounters
	_ [(64 - unsafe.Sizeof(statCounters{})%64) % 64]byte
}

// statCounters are the counters of one stripe.
type statCounters struct {
	decisions, rejected, disaggregated  atomic.Uint64
	promptTokens, predictedCachedTokens atomic.Uint64
	outcomes                            atomic.Uint64
	latency                             latencyHistogram
}

// stripe returns stripe i (taken modulo the number of stripes).
func (s *routerStats) stripe(i uint8) *statStripe { return &s.stripes[i%statStripes] }

func (s *routerStats) record(d *Decision, took time.Duration) {
	st := s.stripe(d.stripe)
	st.decisions.Add(1)
	if d.Disaggregated {
		st.disaggregated.Add(1)
	}
	st.promptTokens.Add(uint64(d.PromptTokens))
	st.predictedCachedTokens.Add(uint64(d.CachedTokens))
	st.latency.observe(took)
	d.serving.decisions.Add(1)
	if d.Disaggregated {
		d.prefill.decisions.Add(1)
	}
}

// sum adds up a counter over the stripes.
func (s *routerStats) sum(f func(*statCounters) *atomic.Uint64) uint64 {
	var n uint64
	for i := range s.stripes {
		n += f(&s.stripes[i].statCounters).Load()
	}
	return n
}

// latency returns the Select latency histogram summed over the stripes.
func (s *routerStats) latency() Histogram {
	out := Histogram{Bounds: latencyBounds[:], Counts: make([]uint64, len(latencyBounds)+1)}
	for i := range s.stripes {
		h := &s.stripes[i].latency
		out.Sum += time.Duration(h.sum.Load())
		for j := range h.counts {
			c := h.counts[j].Load()
			out.Counts[j] += c
			out.Count += c
		}
	}
	return out
}

// latencyBounds are the upper bounds of the Select latency buckets.
var latencyBounds = [...]time.Duration{
	250 * time.Nanosecond, 500 * time.Nanosecond,
	time.Microsecond, 2 * time.Microsecond, 4 * time.Microsecond, 8 * time.Microsecond,
	16 * time.Microsecond, 32 * time.Microsecond, 64 * time.Microsecond, 128 * time.Microsecond,
	256 * time.Microsecond, time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond,
}

// latencyHistogram counts Select latencies in fixed buckets; the last
// bucket is unbounded.
type latencyHistogram struct {
	counts [len(latencyBounds) + 1]atomic.Uint64
	sum    atomic.Int64
}

func (h *latencyHistogram) observe(d time.Duration) {
	i := 0
	for i < len(latencyBounds) && d > latencyBounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

// Histogram is a snapshot of the Select latency histogram. Counts[i] is the
// number of calls that took at most Bounds[i] (and more than Bounds[i-1]);
// the last count, one past Bounds, is for longer calls.
type Histogram struct {
	Bounds []time.Duration
	Counts []uint64
	Count  uint64
	Sum    time.Duration
}

// Quantile returns the upper bound of the bucket holding quantile q (0 to
// 1), or +Inf as the largest duration when it falls in the last bucket.
func (h Histogram) Quantile(q float64) time.Duration {
	if h.Count == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.Count)))
	var seen uint64
	for i, c := range h.Counts {
		seen += c
		if seen >= rank {
			if i < len(h.Bounds) {
				return h.Bounds[i]
			}
			break
		}
	}
	return time.Duration(math.MaxInt64)
}

// feedback keeps routing accuracy over the most recent outcomes that
// reported the engine's actual cached tokens.
type feedback struct {
	mu     sync.Mutex // protects the fields below
	ring   []bool     // hit or miss of the last len(ring) outcomes
	next   int
	filled int
	hits   int

	actualCachedTokens atomic.Uint64
	reportedTokens     atomic.Uint64 // prompt tokens of outcomes with actual cached tokens
	predictedReported  atomic.Uint64 // predicted cached tokens of those outcomes
	failures           atomic.Uint64
}

// hitThreshold is the fraction of the predicted overlap the engine must
// actually have found for a decision to count as accurate.
const hitThreshold = 0.8

func (f *feedback) add(hit bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.ring) == 0 {
		return
	}
	if f.filled == len(f.ring) {
		if f.ring[f.next] {
			f.hits--
		}
	} else {
		f.filled++
	}
	f.ring[f.next] = hit
	if hit {
		f.hits++
	}
	f.next = (f.next + 1) % len(f.ring)
}

func (f *feedback) accuracy() (float64, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.filled == 0 {
		return 1, 0
	}
	return float64(f.hits) / float64(f.filled), f.filled
}

// RecommendedSyncInterval maps routing accuracy to how often the index
// should be synchronised with the engines: the less accurate the
// predictions, the more often.
func RecommendedSyncInterval(accuracy float64) time.Duration {
	switch {
	case accuracy > 0.95:
		return 5 * time.Second
	case accuracy > 0.85:
		return 2 * time.Second
	case accuracy > 0.70:
		return time.Second
	}
	return 500 * time.Millisecond
}

// observe takes a finished decision's outcome into feedback and health.
// Health is the worker's only while it is the incarnation the decision was
// made for: an outcome arriving after the worker was removed (and perhaps
// added again under its id) says nothing about the worker now registered.
func (r *Router) observe(d *Decision, o Outcome) {
	f := &r.feedback
	r.stats.stripe(d.stripe).outcomes.Add(1)
	if dm := r.domain(d.Worker); dm != nil && dm.domainState == d.serving {
		switch {
		case o.Err == nil:
			r.noteSuccess(dm)
		case !errors.Is(o.Err, context.Canceled) && !errors.Is(o.Err, ErrNoVerdict):
			f.failures.Add(1)
			r.noteError(dm)
		}
	}
	if !o.CachedTokensKnown || o.Err != nil {
		return
	}
	f.actualCachedTokens.Add(uint64(max(o.CachedTokens, 0)))
	f.reportedTokens.Add(uint64(d.PromptTokens))
	f.predictedReported.Add(uint64(d.CachedTokens))
	if d.CachedTokens > 0 {
		f.add(float64(o.CachedTokens) >= hitThreshold*float64(d.CachedTokens))
	}
}

// WorkerStats is one cache domain's state in a Stats snapshot.
type WorkerStats struct {
	Worker kvroute.WorkerKey
	Role   Role
	Health Health
	// Tracked is the load the router's tracker attributes to it.
	Tracked scheduling.WorkerLoad
	// Reported is its last heartbeat report, if any.
	Reported scheduling.Load
	// Decisions is the number of requests routed to it.
	Decisions uint64
}

// Stats is a snapshot of the router's counters, plain data.
type Stats struct {
	Decisions     uint64 // successful Select calls
	Rejected      uint64 // failed Select calls
	Disaggregated uint64 // decisions with a prefill and a decode worker
	Outcomes      uint64 // Done calls
	Failures      uint64 // Done calls with an error counted against the worker (see Outcome.Err)

	PromptTokens          uint64 // prompt tokens of all decisions
	PredictedCachedTokens uint64 // cached tokens the index predicted for them
	// PredictedHitRate is PredictedCachedTokens / PromptTokens.
	PredictedHitRate float64
	// ActualCachedTokens is the cached tokens engines reported in Done,
	// and ActualHitRate their share of those requests' prompt tokens.
	ActualCachedTokens uint64
	ActualHitRate      float64
	// Accuracy is the share of recent decisions with a predicted overlap
	// whose engine found at least 80% of it, over AccuracySamples outcomes
	// (1 with no samples).
	Accuracy        float64
	AccuracySamples int
	// RecommendedSyncInterval is RecommendedSyncInterval(Accuracy).
	RecommendedSyncInterval time.Duration

	QueueDepth      int
	TrackedRequests int
	Workers         []WorkerStats
	// SelectLatency is the histogram of Select durations.
	SelectLatency Histogram
}

// Stats returns a snapshot of the router's counters.
func (r *Router) Stats() Stats {
	f := &r.feedback
	st := Stats{
		Decisions:             r.stats.sum(func(c *statCounters) *atomic.Uint64 { return &c.decisions }),
		Rejected:              r.stats.sum(func(c *statCounters) *atomic.Uint64 { return &c.rejected }),
		Disaggregated:         r.stats.sum(func(c *statCounters) *atomic.Uint64 { return &c.disaggregated }),
		Outcomes:              r.stats.sum(func(c *statCounters) *atomic.Uint64 { return &c.outcomes }),
		Failures:              f.failures.Load(),
		PromptTokens:          r.stats.sum(func(c *statCounters) *atomic.Uint64 { return &c.promptTokens }),
		PredictedCachedTokens: r.stats.sum(func(c *statCounters) *atomic.Uint64 { return &c.predictedCachedTokens }),
		ActualCachedTokens:    f.actualCachedTokens.Load(),
		TrackedRequests:       r.tracker.Len(),
		SelectLatency:         r.stats.latency(),
	}
	if st.PromptTokens > 0 {
		st.PredictedHitRate = float64(st.PredictedCachedTokens) / float64(st.PromptTokens)
	}
	if rt := f.reportedTokens.Load(); rt > 0 {
		st.ActualHitRate = float64(st.ActualCachedTokens) / float64(rt)
	}
	st.Accuracy, st.AccuracySamples = f.accuracy()
	st.RecommendedSyncInterval = RecommendedSyncInterval(st.Accuracy)
	if r.queue != nil {
		st.QueueDepth = r.queue.Len()
	}
	for _, d := range r.snap.Load().domains {
		ws := WorkerStats{Worker: d.key, Role: d.role, Health: d.currentHealth(),
			Tracked: r.tracker.Load(d.key), Decisions: d.decisions.Load()}
		if rep := d.reported.Load(); rep != nil {
			ws.Reported = *rep
		}
		st.Workers = append(st.Workers, ws)
	}
	return st
}
