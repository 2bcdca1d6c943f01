package bench

import (
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// CandidatePolicies returns configurations measured against kvroute's
// default (KVRoutePolicy) as candidates to replace it; kvsim runs them by
// name. Each is kvroute's previous default cost,
//
//	scheduling.DynamoCost with PreviousCostConfig()
//
// (scheduling.DefaultCostConfig without its KV-pressure term) under a
// different load rule, with the engines' load reports merged with the
// router's own counts (router.LoadReportMerged) unless the policy counts
// only its own requests (Policy.OwnLoad):
//
//   - kvroute-previous: the previous default itself, inside BoundedLoad on
//     requests with PreviousLoadBoundFactor (1.5);
//   - kvroute-own: the same, counting only the router's own requests
//     (Policy.OwnLoad);
//   - kvroute-spread: SpreadBound (no worker the mean number of requests
//     or more ahead of the least loaded, one ahead always allowed) inside
//     the previous default's BoundedLoad, load reports merged;
//   - kvroute-spread-own: the same, counting only the router's own
//     requests;
//   - kvroute-spread-holder: kvroute-spread, and a worker caching at least
//     80% of the prompt may take one request more;
//   - kvroute-spread-own-holder: the same, counting only the router's own
//     requests;
//   - kvroute-spread-own-holder2: the same with two requests more for
//     holders;
//   - kvroute-spread-fresh-holder: kvroute-spread-holder, load reports
//     counted for FreshLoadWindow after they arrive (Policy.FreshLoad);
//   - kvroute-spread-active-holder: kvroute-spread-holder, and a worker
//     on which 80% of the prompt is active (in requests in flight) may
//     take two requests more;
//   - kvroute-spread-idle-holder: kvroute-spread-active-holder, and while
//     a worker is idle no worker may run more than one request ahead of
//     it (SpreadBoundConfig.IdleFirst);
//   - kvroute-spread-kv-own: SpreadBound on distinct active KV blocks
//     inside BoundedLoad on KV blocks, counting only the router's own
//     requests: a request whose prefix is active on a worker adds only its
//     own blocks there;
//   - kvroute-spread-kv-holder: SpreadBound on distinct active KV blocks,
//     holders of 80% of the prompt allowed the request's blocks more,
//     inside the previous default's BoundedLoad on requests, load reports
//     merged; kvroute-spread-kv-own-holder the same counting only the
//     router's own requests, kvroute-spread-kv2-holder with Slack 2;
//   - kvroute-kvpressure: the previous cost plus the KV-pressure term
//     with weight 8,000 (scheduling.DynamoCostConfig.KVPressureWeight: a
//     worker's KV cache held in flight, with the request, costs up to
//     8,000 blocks: at 800 blocks per worker one block in flight costs 10,
//     at 32,768 a quarter), inside BoundedLoad on requests with factor 2;
//     kvroute-kvpressure-own the same counting only the router's own
//     requests, which is kvroute's default now (KVRoutePolicy),
//     kvroute-kvpressure4k-own, kvroute-kvpressure5k-own and
//     kvroute-kvpressure6k-own with weights 4,000, 5,000 and 6,000;
//   - kvroute-kvadded: the previous cost plus KVPressure on the blocks the
//     request adds to a worker's active KV, times the requests they slow
//     (KVPressureAdded), weight 8,000, inside BoundedLoad on requests with
//     factor 2, load reports merged; kvroute-kvadded4k with weight 4,000;
//   - kvroute-kvbound-own: kvroute's default cost
//     (scheduling.DefaultCostConfig) inside BoundedLoad on distinct active
//     KV blocks (scheduling.MeasureKVBlocks) instead of requests, factor 2,
//     counting only the router's own requests: requests that share a
//     prefix in flight may gather on one worker beyond twice the mean of
//     requests;
//   - kvroute-kvpressure-dropprefill and kvroute-kvpressure-dropcount:
//     kvroute-kvpressure with the engines' reported prefill tokens
//     (WithoutReportedPrefill), or their reported request counts
//     (WithoutReportedRequests), dropped (Policy.ReportFilter): which of the
//     merged counts keeps the router from the placements of
//     kvroute-kvpressure-own.
func CandidatePolicies() []Policy {
	return []Policy{
		{
			Name:        "kvroute-previous",
			Description: "kvroute's previous default: Dynamo cost with overlap weight 2, prefill load scale 16, 16 blocks per active request, load bounded at 1.5× the mean, load reports merged",
			Configure:   func(kvroute.Clock) (router.Config, error) { return DefaultCostUnder(nil, scheduling.MeasureRequests) },
		},
		{
			Name:        "kvroute-own",
			Description: "kvroute's previous default counting only its own requests",
			Configure:   func(kvroute.Clock) (router.Config, error) { return DefaultCostUnder(nil, scheduling.MeasureRequests) },
			OwnLoad:     true,
		},
		spreadPolicy("kvroute-spread", "kvroute's previous cost, spread bound", SpreadBoundConfig{}, false),
		spreadPolicy("kvroute-spread-own", "kvroute's previous cost, spread bound, own requests only", SpreadBoundConfig{}, true),
		spreadPolicy("kvroute-spread-holder", "kvroute's previous cost, spread bound with one more request for holders of 80% of the prompt",
			SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1}, false),
		spreadPolicy("kvroute-spread-own-holder", "kvroute's previous cost, spread bound with one more request for holders of 80% of the prompt, own requests only",
			SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1}, true),
		spreadPolicy("kvroute-spread-own-holder2", "kvroute's previous cost, spread bound with two more requests for holders of 80% of the prompt, own requests only",
			SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 2}, true),
		func() Policy {
			p := spreadPolicy("kvroute-spread-fresh-holder", "kvroute's previous cost, spread bound with one more request for holders of 80% of the prompt, load reports counted while fresh",
				SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1}, false)
			p.FreshLoad = FreshLoadWindow
			return p
		}(),
		spreadPolicy("kvroute-spread-active-holder", "kvroute's previous cost, spread bound with one more request for holders of 80% of the prompt and two more where 80% of it is in flight",
			SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1, ActiveExtra: 2}, false),
		spreadPolicy("kvroute-spread-idle-holder", "kvroute-spread-active-holder, no worker more than one request ahead of an idle one",
			SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1, ActiveExtra: 2, IdleFirst: true}, false),
		spreadPolicy("kvroute-spread-kv-own", "kvroute's previous cost, spread and load bounds on distinct active KV blocks, own requests only",
			SpreadBoundConfig{Measure: scheduling.MeasureKVBlocks}, true),
		boundedSpreadPolicy("kvroute-spread-kv-holder", "kvroute's previous cost, spread bound on distinct active KV blocks with a request's blocks more for holders of 80% of the prompt",
			SpreadBoundConfig{Measure: scheduling.MeasureKVBlocks, HolderShare: 0.8, HolderExtra: 1}, scheduling.MeasureRequests, false),
		boundedSpreadPolicy("kvroute-spread-kv-own-holder", "kvroute-spread-kv-holder, own requests only",
			SpreadBoundConfig{Measure: scheduling.MeasureKVBlocks, HolderShare: 0.8, HolderExtra: 1}, scheduling.MeasureRequests, true),
		boundedSpreadPolicy("kvroute-spread-kv2-holder", "kvroute-spread-kv-holder with twice the slack",
			SpreadBoundConfig{Measure: scheduling.MeasureKVBlocks, Slack: 2, HolderShare: 0.8, HolderExtra: 1}, scheduling.MeasureRequests, false),
		kvPressurePolicy("kvroute-kvpressure", KVPressureConfig{Weight: 8000}, 2, false),
		kvPressurePolicy("kvroute-kvpressure-own", KVPressureConfig{Weight: 8000}, 2, true),
		kvPressurePolicy("kvroute-kvpressure4k-own", KVPressureConfig{Weight: 4000}, 2, true),
		kvPressurePolicy("kvroute-kvpressure6k-own", KVPressureConfig{Weight: 6000}, 2, true),
		kvPressurePolicy("kvroute-kvpressure5k-own", KVPressureConfig{Weight: 5000}, 2, true),
		kvPressurePolicy("kvroute-kvadded", KVPressureConfig{Weight: 8000, Measure: KVPressureAdded}, 2, false),
		kvPressurePolicy("kvroute-kvadded4k", KVPressureConfig{Weight: 4000, Measure: KVPressureAdded}, 2, false),
		{
			Name:        "kvroute-kvbound-own",
			Description: "kvroute's default cost, load bounded at 2× the mean of distinct active KV blocks instead of requests, own requests only",
			Configure: func(kvroute.Clock) (router.Config, error) {
				return DynamoCostUnder(scheduling.DefaultCostConfig(), &scheduling.BoundedLoadConfig{Measure: scheduling.MeasureKVBlocks})
			},
			OwnLoad: true,
		},
		func() Policy {
			p := kvPressurePolicy("kvroute-kvpressure-dropprefill", KVPressureConfig{Weight: 8000}, 2, false)
			p.Description += ", reported prefill tokens dropped"
			p.ReportFilter = WithoutReportedPrefill
			return p
		}(),
		func() Policy {
			p := kvPressurePolicy("kvroute-kvpressure-dropcount", KVPressureConfig{Weight: 8000}, 2, false)
			p.Description += ", reported request counts dropped"
			p.ReportFilter = WithoutReportedRequests
			return p
		}(),
	}
}

// kvPressurePolicy returns kvroute's previous cost plus the KV-pressure
// term kv, inside scheduling.BoundedLoad on requests with the given factor.
func kvPressurePolicy(name string, kv KVPressureConfig, factor float64, own bool) Policy {
	what := "held in flight"
	if kv.Measure == KVPressureAdded {
		what = "added in flight, times the requests it slows"
	}
	desc := fmt.Sprintf("kvroute's previous cost plus %g times the KV cache share %s, at most %g times the mean of requests", kv.Weight, what, factor)
	if own {
		desc += ", own requests only"
	}
	return Policy{
		Name:        name,
		Description: desc,
		Configure: func(kvroute.Clock) (router.Config, error) {
			return KVPressureCost(kv, factor)
		},
		OwnLoad: own,
	}
}

// KVPressureCost returns a router configuration whose cost is kvroute's
// previous cost (scheduling.DynamoCost with PreviousCostConfig()) plus the
// KV-pressure term kv, inside scheduling.BoundedLoad on requests with
// factor, load reports merged (router.LoadReportMerged). The held measure
// is DynamoCost's own term (scheduling.DynamoCostConfig.KVPressureWeight),
// so that with weight 8,000 and factor 2 the cost is kvroute's default
// (scheduling.NewDefaultCost); the added measure wraps DynamoCost in
// KVPressure.
func KVPressureCost(kv KVPressureConfig, factor float64) (router.Config, error) {
	cfg := PreviousCostConfig()
	if kv.Measure == KVPressureHeld {
		if !(kv.Weight >= 0) || math.IsInf(kv.Weight, 0) {
			return router.Config{}, fmt.Errorf("%w: kv pressure weight %v", ErrInvalidConfig, kv.Weight)
		}
		cfg.KVPressureWeight = kv.Weight
	}
	var c scheduling.CostFunc
	c, err := scheduling.NewDynamoCost(cfg)
	if err != nil {
		return router.Config{}, err
	}
	if kv.Measure != KVPressureHeld {
		if c, err = NewKVPressure(c, kv); err != nil {
			return router.Config{}, err
		}
	}
	b, err := scheduling.NewBoundedLoad(c, scheduling.BoundedLoadConfig{Factor: factor})
	if err != nil {
		return router.Config{}, err
	}
	return router.Config{Cost: b, LoadReports: router.LoadReportMerged}, nil
}

// FreshLoadWindow is how long the kvroute-spread-fresh-holder candidate
// counts a load report (Policy.FreshLoad): a few decode steps of a busy
// engine, which reports every step, and a fifth of the second an idle
// Dynamo engine takes between reports.
const FreshLoadWindow = 200 * time.Millisecond

func spreadPolicy(name, desc string, cfg SpreadBoundConfig, own bool) Policy {
	return boundedSpreadPolicy(name, desc, cfg, cfg.Measure, own)
}

// boundedSpreadPolicy is spreadPolicy with the outer BoundedLoad on load
// measure outer instead of the spread bound's.
func boundedSpreadPolicy(name, desc string, cfg SpreadBoundConfig, outer scheduling.LoadMeasure, own bool) Policy {
	return Policy{
		Name:        name,
		Description: desc,
		Configure: func(kvroute.Clock) (router.Config, error) {
			return DefaultCostUnder(&cfg, outer)
		},
		OwnLoad: own,
	}
}

// PreviousLoadBoundFactor is the load bound factor of kvroute's previous
// default: no worker above 1.5 times its fair share of the requests in
// flight.
const PreviousLoadBoundFactor = 1.5

// PreviousCostConfig returns the cost of kvroute's previous default, which
// the candidates build on: scheduling.DefaultCostConfig() without its
// KV-pressure term (overlap weight 2, prefill load scale 16, 16 blocks per
// active request).
func PreviousCostConfig() scheduling.DynamoCostConfig {
	cfg := scheduling.DefaultCostConfig()
	cfg.KVPressureWeight = 0
	return cfg
}

// DynamoCostUnder returns a router configuration whose cost is
// scheduling.DynamoCost with cfg, inside scheduling.BoundedLoad with bound
// unless bound is nil, the router counting the load of its own requests
// and taking only capacities from the engines' reports (the zero
// router.Config.LoadReports), as kvroute's default does. With
// scheduling.DefaultCostConfig() and the zero bound it routes as the zero
// router.Config.
func DynamoCostUnder(cfg scheduling.DynamoCostConfig, bound *scheduling.BoundedLoadConfig) (router.Config, error) {
	c, err := scheduling.NewDynamoCost(cfg)
	if err != nil || bound == nil {
		return router.Config{Cost: c}, err
	}
	b, err := scheduling.NewBoundedLoad(c, *bound)
	return router.Config{Cost: b}, err
}

// DefaultCostUnder returns a router configuration whose cost is kvroute's
// previous default cost (scheduling.DynamoCost with PreviousCostConfig())
// inside a SpreadBound with spread, when spread is not nil, inside
// scheduling.BoundedLoad with PreviousLoadBoundFactor on load measure
// outer, load reports merged (router.LoadReportMerged): with nil spread
// and outer scheduling.MeasureRequests, kvroute's previous default.
func DefaultCostUnder(spread *SpreadBoundConfig, outer scheduling.LoadMeasure) (router.Config, error) {
	var c scheduling.CostFunc
	c, err := scheduling.NewDynamoCost(PreviousCostConfig())
	if err != nil {
		return router.Config{}, err
	}
	if spread != nil {
		if c, err = NewSpreadBound(c, *spread); err != nil {
			return router.Config{}, err
		}
	}
	b, err := scheduling.NewBoundedLoad(c, scheduling.BoundedLoadConfig{Factor: PreviousLoadBoundFactor, Measure: outer})
	if err != nil {
		return router.Config{}, err
	}
	return router.Config{Cost: b, LoadReports: router.LoadReportMerged}, nil
}
