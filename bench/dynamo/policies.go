package main

import (
	"fmt"
	"slices"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// libPolicies are the router configurations the kvroute-lib arm can run.
var libPolicies = map[string]func() (router.Config, error){
	"default": func() (router.Config, error) { return router.Config{}, nil },
	"dynamo": func() (router.Config, error) {
		c, err := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{})
		return router.Config{Cost: c}, err
	},
	"tuned": func() (router.Config, error) {
		c, err := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{
			OverlapWeight: scheduling.Float(2), PrefillLoadScale: scheduling.Float(16), ActiveRequestWeight: 16,
		})
		return router.Config{Cost: c}, err
	},
}

// tuned is Dynamo's cost with overlap weight 2, prefill load scale 16 and
// 16 blocks per active request.
func tuned() (scheduling.CostFunc, error) {
	return scheduling.NewDynamoCost(scheduling.DynamoCostConfig{
		OverlapWeight: scheduling.Float(2), PrefillLoadScale: scheduling.Float(16), ActiveRequestWeight: 16,
	})
}

func bounded(inner func() (scheduling.CostFunc, error), factor float64) func() (router.Config, error) {
	return boundedBy(inner, factor, scheduling.MeasureKVBlocks)
}

func boundedBy(inner func() (scheduling.CostFunc, error), factor float64, m scheduling.LoadMeasure) func() (router.Config, error) {
	return func() (router.Config, error) {
		c, err := inner()
		if err != nil {
			return router.Config{}, err
		}
		b, err := scheduling.NewBoundedLoad(c, scheduling.BoundedLoadConfig{Factor: factor, Measure: m})
		return router.Config{Cost: b}, err
	}
}

func dynamoDefault() (scheduling.CostFunc, error) {
	return scheduling.NewDynamoCost(scheduling.DynamoCostConfig{})
}

func dynamoOW(ow, pls float64) func() (scheduling.CostFunc, error) {
	return func() (scheduling.CostFunc, error) {
		return scheduling.NewDynamoCost(scheduling.DynamoCostConfig{OverlapWeight: scheduling.Float(ow), PrefillLoadScale: scheduling.Float(pls)})
	}
}

func init() {
	libPolicies["tuned-b1.25"] = bounded(tuned, 1.25)
	libPolicies["tuned-b1.5"] = bounded(tuned, 1.5)
	libPolicies["tuned-req1.5"] = boundedBy(tuned, 1.5, scheduling.MeasureRequests)
	libPolicies["tuned-kv1"] = boundedBy(tuned, 1, scheduling.MeasureKVBlocks)
	libPolicies["ow2-kv1"] = boundedBy(dynamoOW(2, 1), 1, scheduling.MeasureKVBlocks)
	libPolicies["dynamo-b1.5"] = bounded(dynamoDefault, 1.5)
	libPolicies["ow2-b1.5"] = bounded(dynamoOW(2, 1), 1.5)
	libPolicies["ow2-pls4-b1.5"] = bounded(dynamoOW(2, 4), 1.5)
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
