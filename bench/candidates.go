package bench

import (
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// CandidatePolicies returns configurations measured against kvroute's
// default (KVRoutePolicy) as candidates to replace it; kvsim runs them by
// name. Each is kvroute's default cost,
//
//	scheduling.DynamoCost with scheduling.DefaultCostConfig()
//
// under a different load rule:
//
//   - kvroute-own: the default's BoundedLoad, counting only the router's
//     own requests (Policy.OwnLoad);
//   - kvroute-spread: SpreadBound (no worker the mean number of requests
//     or more ahead of the least loaded, one ahead always allowed) inside
//     the default's BoundedLoad, load reports merged as by default;
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
//     own blocks there.
func CandidatePolicies() []Policy {
	return []Policy{
		{
			Name:        "kvroute-own",
			Description: "kvroute's default counting only its own requests",
			Configure:   func(kvroute.Clock) (router.Config, error) { return DefaultCostUnder(nil) },
			OwnLoad:     true,
		},
		spreadPolicy("kvroute-spread", "kvroute's default cost, spread bound", SpreadBoundConfig{}, false),
		spreadPolicy("kvroute-spread-own", "kvroute's default cost, spread bound, own requests only", SpreadBoundConfig{}, true),
		spreadPolicy("kvroute-spread-holder", "kvroute's default cost, spread bound with one more request for holders of 80% of the prompt",
			SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1}, false),
		spreadPolicy("kvroute-spread-own-holder", "kvroute's default cost, spread bound with one more request for holders of 80% of the prompt, own requests only",
			SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1}, true),
		spreadPolicy("kvroute-spread-own-holder2", "kvroute's default cost, spread bound with two more requests for holders of 80% of the prompt, own requests only",
			SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 2}, true),
		func() Policy {
			p := spreadPolicy("kvroute-spread-fresh-holder", "kvroute's default cost, spread bound with one more request for holders of 80% of the prompt, load reports counted while fresh",
				SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1}, false)
			p.FreshLoad = FreshLoadWindow
			return p
		}(),
		spreadPolicy("kvroute-spread-active-holder", "kvroute's default cost, spread bound with one more request for holders of 80% of the prompt and two more where 80% of it is in flight",
			SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1, ActiveExtra: 2}, false),
		spreadPolicy("kvroute-spread-idle-holder", "kvroute-spread-active-holder, no worker more than one request ahead of an idle one",
			SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1, ActiveExtra: 2, IdleFirst: true}, false),
		spreadPolicy("kvroute-spread-kv-own", "kvroute's default cost, spread and load bounds on distinct active KV blocks, own requests only",
			SpreadBoundConfig{Measure: scheduling.MeasureKVBlocks}, true),
	}
}

// FreshLoadWindow is how long the kvroute-spread-fresh-holder candidate
// counts a load report (Policy.FreshLoad): a few decode steps of a busy
// engine, which reports every step, and a fifth of the second an idle
// Dynamo engine takes between reports.
const FreshLoadWindow = 200 * time.Millisecond

func spreadPolicy(name, desc string, cfg SpreadBoundConfig, own bool) Policy {
	return Policy{
		Name:        name,
		Description: desc,
		Configure: func(kvroute.Clock) (router.Config, error) {
			return DefaultCostUnder(&cfg)
		},
		OwnLoad: own,
	}
}

// DefaultCostUnder returns a router configuration whose cost is kvroute's
// default cost (scheduling.DynamoCost with scheduling.DefaultCostConfig())
// inside a SpreadBound with spread, when spread is not nil, inside
// scheduling.BoundedLoad with its default factor and spread's measure:
// with nil spread, the zero router.Config's cost.
func DefaultCostUnder(spread *SpreadBoundConfig) (router.Config, error) {
	var c scheduling.CostFunc
	c, err := scheduling.NewDynamoCost(scheduling.DefaultCostConfig())
	if err != nil {
		return router.Config{}, err
	}
	var m scheduling.LoadMeasure
	if spread != nil {
		if c, err = NewSpreadBound(c, *spread); err != nil {
			return router.Config{}, err
		}
		m = spread.Measure
	}
	b, err := scheduling.NewBoundedLoad(c, scheduling.BoundedLoadConfig{Measure: m})
	if err != nil {
		return router.Config{}, err
	}
	return router.Config{Cost: b}, nil
}
