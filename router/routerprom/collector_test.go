package routerprom_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

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
