package scheduling

import (
	"math"
	"time"

	"github.com/kvroute/kvroute"
)

// OptFloat is an optional float64. The zero value is unset, so a zero
// weight or temperature can be told apart from "use the default".
type OptFloat struct {
	// Value is the value, meaningful only when Set is true.
	Value float64
	// Set reports whether Value is present.
	Set bool
}

// Float returns an OptFloat holding v.
func Float(v float64) OptFloat { return OptFloat{Value: v, Set: true} }

// Or returns the value when it is set and def otherwise.
func (o OptFloat) Or(def float64) float64 {
	if o.Set {
		return o.Value
	}
	return def
}

// valid reports whether an unset value, or a set finite non-negative one.
func (o OptFloat) valid() bool {
	return !o.Set || (o.Value >= 0 && !math.IsInf(o.Value, 0))
}

// Overrides are per-request replacements of a cost function's weights and
// of the selector's temperature. Unset fields keep the configured value.
// Each cost function documents which fields it honours; set values that are
// negative or not finite are ignored, because overrides may come from
// request headers.
type Overrides struct {
	// OverlapWeight replaces DynamoCostConfig.OverlapWeight.
	OverlapWeight OptFloat
	// PrefillLoadScale replaces DynamoCostConfig.PrefillLoadScale.
	PrefillLoadScale OptFloat
	// CacheWeight replaces WeightedScoreConfig.CacheWeight.
	CacheWeight OptFloat
	// LoadWeight replaces WeightedScoreConfig.LoadWeight.
	LoadWeight OptFloat
	// MemoryWeight replaces WeightedScoreConfig.MemoryWeight.
	MemoryWeight OptFloat
	// Temperature replaces SelectorConfig.Temperature; pass it to
	// Selector.Select.
	Temperature OptFloat
}

// or returns o's value when it is set to a finite non-negative number and
// def otherwise.
func or(o OptFloat, def float64) float64 {
	if o.Set && o.Value >= 0 && !math.IsInf(o.Value, 0) {
		return o.Value
	}
	return def
}

// Request describes the request being routed, as far as scheduling needs
// to know it.
type Request struct {
	// PromptTokens is the input sequence length (ISL) in tokens.
	PromptTokens int
	// Blocks is the number of full blocks of the prompt (the number of
	// sequence hashes the hasher produced).
	Blocks int
	// BlockSize is the tokens per KV block. Zero means the cost function's
	// configured block size.
	BlockSize int
	// Priority is the strict priority class: a higher class is always
	// admitted from the queue before a lower one.
	Priority uint32
	// PriorityJump moves the request ahead inside its class, in seconds of
	// waiting time (FCFS, LCFS) or as extra weight (WSPT). Negative values
	// count as zero.
	PriorityJump float64
	// ExpectedOutputTokens is the expected output length, zero when unknown.
	ExpectedOutputTokens int
	// Arrival is when the request arrived. Zero means "now" to the queue.
	Arrival time.Time
	// Overrides replaces configured weights for this request only.
	Overrides Overrides
}

// Load is a worker's current load, as the host or a Tracker reports it.
// Zero fields mean "none" or, for capacities, "unknown".
type Load struct {
	// ActivePrefillTokens is the number of prompt tokens still to be
	// prefilled by requests already routed to the worker.
	ActivePrefillTokens int
	// ActiveDecodeBlocks is the number of distinct KV blocks (prompt and
	// output) that the worker's active requests hold.
	ActiveDecodeBlocks int
	// PotentialDecodeBlocks is ActiveDecodeBlocks plus the blocks of the
	// request being routed that are not already active on the worker: the
	// decode load the worker would carry if it got the request. Tracker
	// computes it (Tracker.FillLoad); a host without a tracker sets it to
	// ActiveDecodeBlocks + Request.Blocks.
	PotentialDecodeBlocks int
	// ActiveRequests is the number of requests the worker is serving.
	ActiveRequests int
	// MaxRequests is the worker's number of request slots (its maximum
	// batch of running sequences), zero when unknown.
	MaxRequests int
	// QueueDepth is the number of requests waiting inside the engine.
	QueueDepth int
	// KVUtilization is the fraction of the worker's KV cache in use, 0 to 1.
	KVUtilization float64
	// KVCapacityBlocks is the worker's KV cache size in blocks, zero when
	// unknown.
	KVCapacityBlocks int
	// MaxBatchedTokens is the engine's token budget per forward pass
	// (vLLM max_num_batched_tokens), zero when unknown.
	MaxBatchedTokens int
	// PrefillTokensPerSecond is the worker's measured prefill throughput,
	// zero when unknown.
	PrefillTokensPerSecond float64
}

// Capacities returns the capacities of l alone (request slots, KV cache
// blocks, token budget per pass, prefill throughput) with every count of
// requests, tokens and blocks in use zero: what a router that counts
// only the requests it routed takes from an engine's load report.
func (l Load) Capacities() Load {
	return Load{
		MaxRequests:            l.MaxRequests,
		KVCapacityBlocks:       l.KVCapacityBlocks,
		MaxBatchedTokens:       l.MaxBatchedTokens,
		PrefillTokensPerSecond: l.PrefillTokensPerSecond,
	}
}

// Candidate is one worker that may serve the request, with what it caches
// of the prompt and how loaded it is. Hosts build a []Candidate per request
// and reuse it between requests. The fields cost functions read on every
// decision come first, so they share two cache lines.
type Candidate struct {
	// Worker identifies the cache domain.
	Worker kvroute.WorkerKey
	// Cached is the prompt prefix the worker holds, in blocks, by storage
	// tier: Cached[t] counts the prefix blocks whose fastest tier on the
	// worker is t. The sum is the matched prefix depth.
	Cached [kvroute.NumTiers]int
	// OverlapDiscount is the fraction of Cached that cost functions ignore,
	// 0 (trust the index) to 1 (ignore the cache). StalenessCost sets it
	// from LastUpdate; hosts may set it themselves.
	OverlapDiscount float64
	// Load is the worker's current load.
	Load Load
	// LastUpdate is when the worker's index entries were last updated (its
	// last KV event). Zero means unknown; StalenessCost then trusts the
	// index.
	LastUpdate time.Time
}

// CachedBlocks returns the matched prefix depth over all tiers.
func (c *Candidate) CachedBlocks() int {
	n := 0
	for _, b := range c.Cached {
		n += b
	}
	return n
}

// CachedCredit returns the cached blocks weighted by tier and reduced by
// OverlapDiscount: (1 − discount) · Σ w[t] · Cached[t].
func (c *Candidate) CachedCredit(w *TierWeights) float64 {
	var s float64
	for t, b := range c.Cached {
		s += w[t] * float64(b)
	}
	d := c.OverlapDiscount
	switch {
	case d <= 0 || d != d:
		return s
	case d >= 1:
		return 0
	}
	return (1 - d) * s
}

// TierWeights weights cached blocks by the tier that holds them: a block
// in host memory saves less prefill time than one on the device, because it
// must be loaded first.
type TierWeights [kvroute.NumTiers]float64

// DefaultTierWeights returns the default tier weights: device 1.0, host
// 0.75, disk 0.25, external 0.25.
func DefaultTierWeights() TierWeights { return TierWeights{1, 0.75, 0.25, 0.25} }

// validate checks that every weight is finite and non-negative.
func (w *TierWeights) validate() bool {
	for _, v := range w {
		if !(v >= 0) || math.IsInf(v, 0) {
			return false
		}
	}
	return true
}

// tierWeightsOrDefault returns *w, or DefaultTierWeights when w is nil.
func tierWeightsOrDefault(w *TierWeights) TierWeights {
	if w == nil {
		return DefaultTierWeights()
	}
	return *w
}
