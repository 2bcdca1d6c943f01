package routerprom_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/router/routerprom"
)

func TestCollector(t *testing.T) {
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 12, Ranks: 2}))
	for range 3 {
		d, err := r.Select(context.Background(), &router.Request{Tokens: make([]uint32, 64)})
		require.NoError(t, err)
		d.Done(router.Outcome{CachedTokens: 0, CachedTokensKnown: true})
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(routerprom.New(r, "kvroute"))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_router_decisions_total Successful routing decisions.
# TYPE kvroute_router_decisions_total counter
kvroute_router_decisions_total 3
# HELP kvroute_router_prompt_tokens_total Prompt tokens of all decisions.
# TYPE kvroute_router_prompt_tokens_total counter
kvroute_router_prompt_tokens_total 192
`), "kvroute_router_decisions_total", "kvroute_router_prompt_tokens_total"))

	n, err := testutil.GatherAndCount(reg, "kvroute_router_worker_health")
	require.NoError(t, err)
	require.Equal(t, 2, n, "one series per data-parallel rank")
	n, err = testutil.GatherAndCount(reg, "kvroute_router_select_duration_seconds")
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// selectN makes n decisions on r and ends them.
func selectN(t *testing.T, r *router.Router, n int) {
	t.Helper()
	for range n {
		d, err := r.Select(context.Background(), &router.Request{Tokens: make([]uint32, 64)})
		require.NoError(t, err)
		d.Done(router.Outcome{})
	}
}

// Two routers of one process register on one registry under constant
// labels, and each series reports its own router.
func TestCollectorSeveralRouters(t *testing.T) {
	routers := map[string]*router.Router{}
	for model, decisions := range map[string]int{"chat": 2, "code": 5} {
		r, err := router.New(router.Config{})
		require.NoError(t, err)
		require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 3}))
		selectN(t, r, decisions)
		routers[model] = r
	}
	reg := prometheus.NewPedanticRegistry()
	for model, r := range routers {
		require.NoError(t, reg.Register(routerprom.NewWithLabels(r, "kvroute", prometheus.Labels{"model": model})))
	}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_router_decisions_total Successful routing decisions.
# TYPE kvroute_router_decisions_total counter
kvroute_router_decisions_total{model="chat"} 2
kvroute_router_decisions_total{model="code"} 5
# HELP kvroute_router_worker_decisions_total Decisions per cache domain.
# TYPE kvroute_router_worker_decisions_total counter
kvroute_router_worker_decisions_total{model="chat",rank="0",role="aggregated",worker="3"} 2
kvroute_router_worker_decisions_total{model="code",rank="0",role="aggregated",worker="3"} 5
`), "kvroute_router_decisions_total", "kvroute_router_worker_decisions_total"))

	// The same labels again, no labels beside labelled collectors, and a
	// label named like a per-worker one are refused at registration.
	tests := []struct {
		name   string
		labels prometheus.Labels
	}{
		{"same labels", prometheus.Labels{"model": "chat"}},
		{"no labels", nil},
		{"per-worker label name", prometheus.Labels{"worker": "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Error(t, reg.Register(routerprom.NewWithLabels(routers["chat"], "kvroute", tt.labels)))
		})
	}
}

// A removed worker's series, and those of a rank a worker no longer has,
// leave with them (also while the index keeps a removed worker's blocks for
// its grace): the collector keeps nothing of departed cache domains.
func TestCollectorDropsDepartedDomains(t *testing.T) {
	r, err := router.New(router.Config{RemoveGrace: time.Minute})
	require.NoError(t, err)
	require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 1}))
	require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 2}))
	require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 3, Ranks: 2}))
	selectN(t, r, 8)
	reg := prometheus.NewRegistry()
	reg.MustRegister(routerprom.New(r, "kvroute"))
	series := func(want int) {
		t.Helper()
		for _, name := range []string{"kvroute_router_worker_health", "kvroute_router_worker_active_requests", "kvroute_router_worker_decisions_total"} {
			n, err := testutil.GatherAndCount(reg, name)
			require.NoError(t, err)
			require.Equal(t, want, n, name)
		}
	}
	series(4)
	require.True(t, r.RemoveWorker(2))
	series(3)
	require.NoError(t, r.UpdateWorker(router.StaticWorker{WorkerID: 3, Ranks: 1}))
	series(2)
}

// Routing accuracy reads 1 before any outcome could measure it; the samples
// gauge tells that apart from a measured perfect accuracy.
func TestCollectorAccuracySamples(t *testing.T) {
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	w := kvroute.WorkerKey{ID: 4}
	require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: w.ID}))
	reg := prometheus.NewRegistry()
	reg.MustRegister(routerprom.New(r, "kvroute"))
	accuracy := func(value, samples string) {
		t.Helper()
		require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_router_routing_accuracy Share of recent decisions whose engine found at least 80% of the predicted overlap (1 while routing_accuracy_samples is 0).
# TYPE kvroute_router_routing_accuracy gauge
kvroute_router_routing_accuracy `+value+`
# HELP kvroute_router_routing_accuracy_samples Recent outcomes with a predicted overlap and reported cached tokens that routing_accuracy is computed over.
# TYPE kvroute_router_routing_accuracy_samples gauge
kvroute_router_routing_accuracy_samples `+samples+`
`), "kvroute_router_routing_accuracy", "kvroute_router_routing_accuracy_samples"))
	}
	accuracy("1", "0")

	// The worker holds the prompt's blocks; the engine then reports that it
	// found none of them: one measured miss.
	prompt := make([]uint32, 64)
	for i := range prompt {
		prompt[i] = uint32(i)
	}
	ev := kvroute.Event{Kind: kvroute.EventStored, Worker: w}
	for i, b := range r.Hasher().AppendBlockHashes(nil, prompt) {
		ev.Blocks = append(ev.Blocks, kvroute.StoredBlock{External: kvroute.ExternalHash(i + 1), Hash: b})
	}
	require.NoError(t, r.Index().Apply(&ev))
	d, err := r.Select(context.Background(), &router.Request{Tokens: prompt})
	require.NoError(t, err)
	require.Equal(t, 64, d.CachedTokens)
	d.Done(router.Outcome{CachedTokens: 0, CachedTokensKnown: true})
	accuracy("0", "1")
}
