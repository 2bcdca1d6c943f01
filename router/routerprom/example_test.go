package routerprom_test

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/router/routerprom"
)

func Example() {
	r, _ := router.New(router.Config{})
	_ = r.AddWorker(router.StaticWorker{WorkerID: 1})

	reg := prometheus.NewRegistry()
	reg.MustRegister(routerprom.New(r, "kvroute"))
	// Serve it with promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).
	n, _ := testutil.GatherAndCount(reg, "kvroute_router_worker_health")
	fmt.Println(n, "worker health series")
	// Output: 1 worker health series
}

// Two routers of one process, one per model, on one registry: each
// collector carries its model as a constant label.
func ExampleNewWithLabels() {
	reg := prometheus.NewRegistry()
	for _, model := range []string{"chat", "code"} {
		r, _ := router.New(router.Config{})
		_ = r.AddWorker(router.StaticWorker{WorkerID: 1})
		reg.MustRegister(routerprom.NewWithLabels(r, "kvroute", prometheus.Labels{"model": model}))
	}
	n, _ := testutil.GatherAndCount(reg, "kvroute_router_worker_health")
	fmt.Println(n, "worker health series")
	// Output: 2 worker health series
}
