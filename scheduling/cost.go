package scheduling

import (
	"fmt"
	"math"

	"github.com/kvroute/kvroute"
)

// CostFunc scores candidates for a request; lower is better.
//
// Costs writes the cost of cands[i] into costs[i] for every i below
// min(len(cands), len(costs)); it must not retain either slice. It is
// called once per routing decision with all candidates, so it can
// normalise across them, and it must be safe for concurrent use. Costs that
// are NaN are treated as +Inf by Selector.
type CostFunc interface {
	Costs(req *Request, cands []Candidate, costs []float64)
}

// CostFuncFunc adapts an ordinary function to CostFunc.
type CostFuncFunc func(req *Request, cands []Candidate, costs []float64)

// Costs calls f(req, cands, costs).
func (f CostFuncFunc) Costs(req *Request, cands []Candidate, costs []float64) { f(req, cands, costs) }

// DefaultBlockSize is the block size a cost function assumes when neither
// the request nor its configuration gives one.
const DefaultBlockSize = kvroute.DefaultBlockSize

// DynamoCostConfig configures DynamoCost. The zero value is NVIDIA
// Dynamo's default router configuration.
type DynamoCostConfig struct {
	// OverlapWeight scales the credit for cached blocks. Unset means 1.0.
	// Zero ignores the cache (load-only routing, as decode routers do).
	OverlapWeight OptFloat
	// PrefillLoadScale scales the prefill term against the decode term.
	// Unset means 1.0.
	PrefillLoadScale OptFloat
	// TierWeights weights cached blocks by tier. Nil means
	// DefaultTierWeights.
	TierWeights *TierWeights
	// ActiveRequestWeight adds this many blocks of cost per active request.
	// Zero (the default) leaves the request count out, as Dynamo does.
	ActiveRequestWeight float64
	// KVPressureWeight is the cost, in blocks, of a worker's whole KV cache
	// held by its requests in flight: the candidate's cost grows by
	// KVPressureWeight · PotentialDecodeBlocks / KVCapacityBlocks (nothing
	// when the capacity is unknown). Zero (the default) leaves it out, as
	// Dynamo does. See DynamoCost.
	KVPressureWeight float64
	// BlockSize is used for requests whose BlockSize is zero. Zero means
	// DefaultBlockSize.
	BlockSize int
}

// DynamoCost is NVIDIA Dynamo's default KV-router cost, in blocks:
//
//	credit  = OverlapWeight · Σ_t TierWeights[t] · Cached[t]   (less OverlapDiscount)
//	prefill = max((ActivePrefillTokens + PromptTokens) / BlockSize − credit, 0)
//	decode  = PotentialDecodeBlocks + ⌈ExpectedOutputTokens / BlockSize⌉
//	over    = max(decode − KVCapacityBlocks, 0)   (0 when the capacity is unknown)
//	cost    = PrefillLoadScale · prefill + decode + over + ActiveRequestWeight · ActiveRequests
//	        + KVPressureWeight · PotentialDecodeBlocks / KVCapacityBlocks   (0 when the capacity is unknown)
//
// The prefill term is the work the worker still has to prefill if it gets
// the request, less what its cache saves; the decode term is the KV blocks
// it would hold, including the blocks the request's expected output will
// fill. Blocks beyond a worker's known KV capacity count twice: the engine
// would have to preempt or evict to hold them.
//
// The KV-pressure term charges the distinct KV blocks a worker's requests
// in flight would hold with the request, as a share of its capacity. A
// request whose prefix is already active on a worker adds only its own
// blocks there, so requests that share a prefix in flight gather at little
// cost, while a worker holding many distinct prompts in flight costs more.
// An engine's decode step grows with the KV its batch reads: with prompts
// a large share of the cache, one more distinct prompt in flight slows
// every request of the worker, and the term then outweighs the prefill a
// cache hit saves; with prompts a small share of a large cache, it is
// small beside the other terms.
//
// It honours Overrides.OverlapWeight and Overrides.PrefillLoadScale.
// DynamoCost is immutable and safe for concurrent use.
type DynamoCost struct {
	overlapWeight       float64
	prefillLoadScale    float64
	tiers               TierWeights
	activeRequestWeight float64
	kvPressureWeight    float64
	blockSize           int
}

// NewDynamoCost returns a DynamoCost for cfg. It returns an error wrapping
// ErrInvalidConfig when a weight is negative or not finite or the block
// size is negative.
func NewDynamoCost(cfg DynamoCostConfig) (*DynamoCost, error) {
	tiers := tierWeightsOrDefault(cfg.TierWeights)
	switch {
	case !cfg.OverlapWeight.valid():
		return nil, fmt.Errorf("%w: overlap weight %v", ErrInvalidConfig, cfg.OverlapWeight.Value)
	case !cfg.PrefillLoadScale.valid():
		return nil, fmt.Errorf("%w: prefill load scale %v", ErrInvalidConfig, cfg.PrefillLoadScale.Value)
	case !tiers.validate():
		return nil, fmt.Errorf("%w: tier weights %v", ErrInvalidConfig, tiers)
	case !(cfg.ActiveRequestWeight >= 0) || math.IsInf(cfg.ActiveRequestWeight, 0):
		return nil, fmt.Errorf("%w: active request weight %v", ErrInvalidConfig, cfg.ActiveRequestWeight)
	case !(cfg.KVPressureWeight >= 0) || math.IsInf(cfg.KVPressureWeight, 0):
		return nil, fmt.Errorf("%w: kv pressure weight %v", ErrInvalidConfig, cfg.KVPressureWeight)
	case cfg.BlockSize < 0:
		return nil, fmt.Errorf("%w: block size %d", ErrInvalidConfig, cfg.BlockSize)
	}
	bs := cfg.BlockSize
	if bs == 0 {
		bs = DefaultBlockSize
	}
	return &DynamoCost{
		overlapWeight:       cfg.OverlapWeight.Or(1),
		prefillLoadScale:    cfg.PrefillLoadScale.Or(1),
		tiers:               tiers,
		activeRequestWeight: cfg.ActiveRequestWeight,
		kvPressureWeight:    cfg.KVPressureWeight,
		blockSize:           bs,
	}, nil
}

// Costs implements CostFunc.
func (d *DynamoCost) Costs(req *Request, cands []Candidate, costs []float64) {
	p := d.params(req)
	n := min(len(cands), len(costs))
	d.costs(&p, req, cands[:n], costs[:n], nil)
}

// costs writes the cost of cands[i] into costs[i] (of the same length).
// When b is not nil it also returns the sums b.bound takes over cands (see
// BoundedLoad.boundOf), so that chooseBoundedDynamo makes one pass for
// both; Costs and chooseBoundedDynamo compute every cost with this same
// code.
func (d *DynamoCost) costs(p *dynamoParams, req *Request, cands []Candidate, costs []float64, b *BoundedLoad) (total, least, r int) {
	least, r = math.MaxInt, 1
	costs = costs[:len(cands)]
	for i := range cands {
		c := &cands[i]
		// Most candidates hold none of the prompt: their credit is +0,
		// which CachedCredit would return too.
		var credit float64
		if c.Cached != ([kvroute.NumTiers]int{}) {
			credit = c.CachedCredit(&d.tiers)
		}
		prefill := float64(c.Load.ActivePrefillTokens)*p.inv + p.isl - p.ow*credit
		if prefill < 0 {
			prefill = 0
		}
		// In float: a request's expected output and an engine's counts
		// may be anything, and an int sum could wrap.
		decode := float64(c.Load.PotentialDecodeBlocks) + float64(p.out)
		capacity := c.Load.KVCapacityBlocks
		if capacity > 0 && decode > float64(capacity) {
			decode += decode - float64(capacity)
		}
		costs[i] = p.pls*prefill + decode + p.arw*float64(c.Load.ActiveRequests)
		if p.kvp > 0 && capacity > 0 {
			costs[i] += p.kvp * float64(max(c.Load.PotentialDecodeBlocks, 0)) / float64(capacity)
		}
		if b != nil {
			now, with, adds := b.loads(req, c)
			total += now
			least = min(least, with)
			r = adds
		}
	}
	return total, least, r
}

// dynamoParams are the terms of DynamoCost that depend on the request only.
type dynamoParams struct {
	ow, pls, inv, isl, arw, kvp float64
	out                         int // blocks of expected output
}

// params returns the request's terms of the cost.
func (d *DynamoCost) params(req *Request) dynamoParams {
	bs := d.blockSize
	if req.BlockSize > 0 {
		bs = req.BlockSize
	}
	p := dynamoParams{
		ow:  or(req.Overrides.OverlapWeight, d.overlapWeight),
		pls: or(req.Overrides.PrefillLoadScale, d.prefillLoadScale),
		inv: 1 / float64(bs),
		arw: d.activeRequestWeight,
		kvp: d.kvPressureWeight,
	}
	p.isl = float64(max(req.PromptTokens, 0)) * p.inv
	if req.ExpectedOutputTokens > 0 {
		p.out = (req.ExpectedOutputTokens-1)/bs + 1
	}
	return p
}

// WeightedScoreConfig configures WeightedScore. The zero value is the
// classic 0.6 · cache − 0.3 · load − 0.1 · memory.
type WeightedScoreConfig struct {
	// CacheWeight weights the cached fraction of the prompt. Unset means 0.6.
	CacheWeight OptFloat
	// LoadWeight weights the candidate's busy slots relative to the
	// busiest candidate's. Unset means 0.3.
	LoadWeight OptFloat
	// MemoryWeight weights KV-cache utilisation. Unset means 0.1.
	MemoryWeight OptFloat
	// TierWeights weights cached blocks by tier. Nil means
	// DefaultTierWeights.
	TierWeights *TierWeights
}

// WeightedScore is a linear score, negated into a cost:
//
//	cache = Σ_t TierWeights[t] · Cached[t] / Blocks   (less OverlapDiscount)
//	busy  = ActiveRequests + QueueDepth
//	load  = busy / max over the candidates of busy   (0 when all are idle)
//	score = CacheWeight · cache − LoadWeight · load − MemoryWeight · KVUtilization
//	cost  = −score
//
// The load term compares the candidates with each other rather than with
// their slot counts: normalised by MaxRequests (often hundreds), the load
// of a worker that holds the prefix would stay negligible until it is
// almost full, and it would win every request until then. A worker that
// is full is for BusyThresholds to leave out. It honours Overrides.CacheWeight, LoadWeight and
// MemoryWeight. WeightedScore is immutable and safe for concurrent use.
type WeightedScore struct {
	cache, load, memory float64
	tiers               TierWeights
}

// NewWeightedScore returns a WeightedScore for cfg. It returns an error
// wrapping ErrInvalidConfig when a weight is negative or not finite.
func NewWeightedScore(cfg WeightedScoreConfig) (*WeightedScore, error) {
	tiers := tierWeightsOrDefault(cfg.TierWeights)
	if !cfg.CacheWeight.valid() || !cfg.LoadWeight.valid() || !cfg.MemoryWeight.valid() || !tiers.validate() {
		return nil, fmt.Errorf("%w: weighted score weights must be finite and non-negative", ErrInvalidConfig)
	}
	return &WeightedScore{
		cache:  cfg.CacheWeight.Or(0.6),
		load:   cfg.LoadWeight.Or(0.3),
		memory: cfg.MemoryWeight.Or(0.1),
		tiers:  tiers,
	}, nil
}

// Costs implements CostFunc.
func (s *WeightedScore) Costs(req *Request, cands []Candidate, costs []float64) {
	wc := or(req.Overrides.CacheWeight, s.cache)
	wl := or(req.Overrides.LoadWeight, s.load)
	wm := or(req.Overrides.MemoryWeight, s.memory)
	n := min(len(cands), len(costs))
	maxBusy := 0
	for i := range n {
		maxBusy = max(maxBusy, busySlots(&cands[i].Load))
	}
	for i := range n {
		c := &cands[i]
		var cache float64
		if req.Blocks > 0 {
			cache = c.CachedCredit(&s.tiers) / float64(req.Blocks)
		}
		var load float64
		if maxBusy > 0 {
			load = float64(busySlots(&c.Load)) / float64(maxBusy)
		}
		costs[i] = -(wc*cache - wl*load - wm*c.Load.KVUtilization)
	}
}

// busySlots returns the requests a worker holds, running or waiting.
func busySlots(l *Load) int { return max(l.ActiveRequests, 0) + max(l.QueueDepth, 0) }
