package main

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
	kvbench "github.com/kvroute/kvroute/bench"
	kvdynamo "github.com/kvroute/kvroute/kvevents/dynamo"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// libPolicies are the router configurations the kvroute-lib arm can run:
// kvroute's default, Dynamo's default cost, the default's cost without its
// load bound, and variants of the bound and of the cost it wraps. All but
// the default merge the engines' load reports with the router's own counts
// (router.LoadReportMerged), as they were measured.
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
		return router.Config{Cost: c, LoadReports: router.LoadReportMerged}, err
	}
}

func bounded(inner func() (scheduling.CostFunc, error), factor float64, m scheduling.LoadMeasure) func() (router.Config, error) {
	return func() (router.Config, error) {
		c, err := inner()
		if err != nil {
			return router.Config{}, err
		}
		b, err := scheduling.NewBoundedLoad(c, scheduling.BoundedLoadConfig{Factor: factor, Measure: m})
		return router.Config{Cost: b, LoadReports: router.LoadReportMerged}, err
	}
}

// libPolicyNames returns the names of libPolicies and of the simulator's
// candidate policies (kvbench.CandidatePolicies), sorted.
func libPolicyNames() []string {
	var n []string
	for k := range libPolicies {
		n = append(n, k)
	}
	for _, p := range kvbench.CandidatePolicies() {
		n = append(n, p.Name)
	}
	slices.Sort(n)
	return n
}

// knownLibPolicy reports whether name is a policy of libPolicyNames.
func knownLibPolicy(name string) bool { return slices.Contains(libPolicyNames(), name) }

// libConfig returns the router configuration of the named policy and how
// its router takes load reports: the fields OwnLoad, FreshLoad and
// ReportFilter of the returned policy (kvbench.Policy); the others are
// unset.
func libConfig(name string) (router.Config, kvbench.Policy, error) {
	if f, ok := libPolicies[name]; ok {
		cfg, err := f()
		return cfg, kvbench.Policy{Name: name}, err
	}
	for _, p := range kvbench.CandidatePolicies() {
		if p.Name == name {
			cfg, err := p.Configure(kvroute.SystemClock{})
			return cfg, p, err
		}
	}
	return router.Config{}, kvbench.Policy{}, fmt.Errorf("unknown -lib-policy %q", name)
}

// loadReporter returns what passes load reports to r under policy p's
// rule (kvbench.Policy.OwnLoad, FreshLoad) and a function that stops it.
func loadReporter(r *router.Router, p kvbench.Policy) (kvdynamo.LoadReporter, func()) {
	switch {
	case !p.OwnLoad && p.FreshLoad > 0:
		f := &freshLoad{r: r, filter: p.ReportFilter, window: p.FreshLoad, gen: map[kvroute.WorkerKey]uint64{}, timers: map[kvroute.WorkerKey]*time.Timer{}}
		return f, f.stop
	case p.OwnLoad || p.ReportFilter != nil:
		return filteredLoad{r: r, filter: p.TakenReport}, func() {}
	}
	return r, func() {}
}

// filteredLoad passes load reports to a router through a filter
// (kvbench.Policy.TakenReport).
type filteredLoad struct {
	r      *router.Router
	filter func(scheduling.Load) scheduling.Load
}

// Heartbeat implements kvdynamo.LoadReporter.
func (f filteredLoad) Heartbeat(w kvroute.WorkerKey, l scheduling.Load) error {
	return f.r.Heartbeat(w, f.filter(l))
}

// freshLoad passes load reports to a router and, window after a worker's
// last report, the report's capacities alone (scheduling.Load.Capacities), so
// that the router counts a report only while it is fresh
// (kvbench.Policy.FreshLoad).
type freshLoad struct {
	r      *router.Router
	filter func(scheduling.Load) scheduling.Load // nil: none
	window time.Duration

	mu      sync.Mutex
	stopped bool
	gen     map[kvroute.WorkerKey]uint64
	timers  map[kvroute.WorkerKey]*time.Timer
}

// Heartbeat implements kvdynamo.LoadReporter.
func (f *freshLoad) Heartbeat(w kvroute.WorkerKey, l scheduling.Load) error {
	if f.filter != nil {
		l = f.filter(l)
	}
	if err := f.r.Heartbeat(w, l); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return nil
	}
	f.gen[w]++
	g, stale := f.gen[w], l.Capacities()
	if t := f.timers[w]; t != nil {
		t.Stop()
	}
	f.timers[w] = time.AfterFunc(f.window, func() {
		f.mu.Lock()
		current := !f.stopped && f.gen[w] == g
		f.mu.Unlock()
		if current {
			_ = f.r.Heartbeat(w, stale)
		}
	})
	return nil
}

// stop cancels the pending expiries.
func (f *freshLoad) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = true
	for _, t := range f.timers {
		t.Stop()
	}
}
