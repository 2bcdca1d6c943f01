package main

import (
	"fmt"
	"slices"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// libPolicies are the router configurations the kvroute-lib arm can run:
// kvroute's default, Dynamo's default cost, the default's cost without its
// load bound, and variants of the bound and of the cost it wraps.
var libPolicies = map[string]func() (router.Config, error){
	"default": func() (router.Config, error) { return router.Config{}, nil },
	"dynamo":  plain(dynamoCost(scheduling.DynamoCostConfig{})),
	"tuned":   plain(dynamoCost(scheduling.DefaultCostConfig())),
	// The default cost bounded by distinct KV blocks instead of requests.
	"tuned-kvblocks": bounded(dynamoCost(scheduling.DefaultCostConfig()), 0, scheduling.MeasureKVBlocks),
	// Dynamo's cost with overlap weight 2 (prefill load scale 1) under the
	// default bound.
	"ow2-bounded": bounded(dynamoCost(scheduling.DynamoCostConfig{OverlapWeight: scheduling.Float(2)}), 0, scheduling.MeasureRequests),
	// Dynamo's default cost under the default bound.
	"dynamo-bounded": bounded(dynamoCost(scheduling.DynamoCostConfig{}), 0, scheduling.MeasureRequests),
}

func dynamoCost(cfg scheduling.DynamoCostConfig) func() (scheduling.CostFunc, error) {
	return func() (scheduling.CostFunc, error) { return scheduling.NewDynamoCost(cfg) }
}

func plain(cost func() (scheduling.CostFunc, error)) func() (router.Config, error) {
	return func() (router.Config, error) {
		c, err := cost()
		return router.Config{Cost: c}, err
	}
}

func bounded(inner func() (scheduling.CostFunc, error), factor float64, m scheduling.LoadMeasure) func() (router.Config, error) {
	return func() (router.Config, error) {
		c, err := inner()
		if err != nil {
			return router.Config{}, err
		}
		b, err := scheduling.NewBoundedLoad(c, scheduling.BoundedLoadConfig{Factor: factor, Measure: m})
		return router.Config{Cost: b}, err
	}
}

func libPolicyNames() []string {
	var n []string
	for k := range libPolicies {
		n = append(n, k)
	}
	slices.Sort(n)
	return n
}

func libConfig(name string) (router.Config, error) {
	f, ok := libPolicies[name]
	if !ok {
		return router.Config{}, fmt.Errorf("unknown -lib-policy %q", name)
	}
	return f()
}
