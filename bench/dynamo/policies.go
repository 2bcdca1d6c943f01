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
