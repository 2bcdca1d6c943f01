package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
	"github.com/stretchr/testify/require"
)

// reducedScenario is scenario (a) cut to n requests.
func reducedScenario(t testing.TB, n int) *Scenario {
	t.Helper()
	sc, err := NewScenario("a", ScenarioOptions{Requests: n, Seed: 1})
	require.NoError(t, err)
	return sc
}

func TestSharedPrefixShape(t *testing.T) {
	sc := reducedScenario(t, 2000)
	results, err := Compare(context.Background(), sc.Config, sc.Workload, Policies(), 0)
	require.NoError(t, err)
	by := map[string]Result{}
	for _, r := range results {
		require.Equal(t, 2000, r.Requests, r.Policy)
		require.Zero(t, r.Events.ApplyErrors+r.Events.DecodeErrors+r.Events.EncodeErrors, "%s: %+v", r.Policy, r.Events)
		require.Positive(t, r.Events.Events, r.Policy)
		by[r.Policy] = r
	}
	tests := []struct {
		name string
		ok   bool
	}{
		{"cache-blind policies stay below 40%", by["round-robin"].HitRate < 0.4 && by["random"].HitRate < 0.4 && by["least-loaded"].HitRate < 0.4},
		{"dynamo's cost beats round-robin clearly", by["dynamo"].HitRate > by["round-robin"].HitRate+0.2},
		{"kvroute reaches 85%", by["kvroute"].HitRate > 0.85},
		{"kvroute keeps load within 1.25", by["kvroute"].LoadImbalance <= 1.25},
		{"kvroute's first tokens come sooner than round-robin's", by["kvroute"].TTFT.P50 < by["round-robin"].TTFT.P50},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.ok {
				var buf bytes.Buffer
				_ = WriteTable(&buf, results)
				t.Fatalf("not so:\n%s", buf.String())
			}
		})
	}
}

func TestRunIsDeterministic(t *testing.T) {
	sc := reducedScenario(t, 500)
	run := func() Result {
		r, err := Run(context.Background(), sc.Config, sc.Workload, KVRoutePolicy())
		require.NoError(t, err)
		// Wall times are measured, not simulated.
		r.Select, r.WallTime = Summary{}, 0
		return r
	}
	require.Equal(t, run(), run())
}

func TestRunStopsWithContext(t *testing.T) {
	sc := reducedScenario(t, 500)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Run(ctx, sc.Config, sc.Workload, KVRoutePolicy())
	require.ErrorIs(t, err, context.Canceled)
}

func TestRunRejectsBadConfig(t *testing.T) {
	wl, err := SharedPrefix(SharedPrefixConfig{Requests: 10})
	require.NoError(t, err)
	tests := []struct {
		name string
		cfg  Config
		p    Policy
	}{
		{"negative workers", Config{Workers: -1}, KVRoutePolicy()},
		{"negative cache", Config{Engine: EngineConfig{CacheBlocks: -1}}, KVRoutePolicy()},
		{"no configure", Config{}, Policy{Name: "x"}},
		{"bad block size", Config{BlockSize: -3}, KVRoutePolicy()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Run(context.Background(), tc.cfg, wl, tc.p)
			require.ErrorIs(t, err, ErrInvalidConfig)
		})
	}
}

func TestBusyPolicyHoldsRequests(t *testing.T) {
	// A threshold of one prefill token marks every worker with work in
	// prefill busy: requests wait at the router, and all still finish.
	p := KVRoutePolicy()
	inner := p.Configure
	p.Configure = func(c kvroute.Clock) (router.Config, error) {
		rc, err := inner(c)
		rc.Busy.MaxPrefillTokens = 1
		return rc, err
	}
	sc := reducedScenario(t, 300)
	r, err := Run(context.Background(), sc.Config, sc.Workload, p)
	require.NoError(t, err)
	require.Equal(t, 300, r.Requests)
	require.Positive(t, r.Deferrals)
}

func TestWriteFormats(t *testing.T) {
	results := []Result{{Workload: "w", Policy: "p", Requests: 3, HitRate: 0.5, LoadImbalance: 1.1}}
	tests := []struct {
		format string
		want   string
	}{
		{"table", "50.0%"},
		{"csv", "workload,policy,hit_rate"},
		{"json", `"hit_rate": 0.5`},
	}
	for _, tc := range tests {
		t.Run(tc.format, func(t *testing.T) {
			var buf bytes.Buffer
			require.NoError(t, Write(&buf, tc.format, results))
			require.Contains(t, buf.String(), tc.want)
			if tc.format == "json" {
				var out []map[string]any
				require.NoError(t, json.Unmarshal(buf.Bytes(), &out))
				require.Len(t, out, 1)
			}
			if tc.format == "csv" {
				require.Equal(t, 2, strings.Count(buf.String(), "\n"))
			}
		})
	}
	require.ErrorIs(t, Write(&bytes.Buffer{}, "xml", results), ErrInvalidConfig)
}

func TestClosedLoopConcurrency(t *testing.T) {
	// Ten requests that all arrive at once, from two closed-loop clients:
	// never more than two in the cluster, and each one after the last but
	// one finished.
	wl := &Workload{Name: "burst"}
	for i := range 10 {
		wl.Requests = append(wl.Requests, Request{
			Prompt: Prompt{{Seed: uint64(i), Len: 256}}, Output: Segment{Seed: 100 + uint64(i), Len: 8},
		})
	}
	cfg := Config{Workers: 4, Concurrency: 2, Engine: EngineConfig{CacheBlocks: 1024}}
	closed, err := Run(context.Background(), cfg, wl, KVRoutePolicy())
	require.NoError(t, err)
	cfg.Concurrency = 0
	open, err := Run(context.Background(), cfg, wl, KVRoutePolicy())
	require.NoError(t, err)

	require.Equal(t, 10, closed.Requests)
	sum := 0.0
	for _, a := range closed.ActivePerWorker {
		sum += a
	}
	require.LessOrEqual(t, sum, 2.0+1e-9, "time-averaged requests in the cluster")
	require.Greater(t, closed.Duration, open.Duration, "two clients take longer than ten at once")
	require.Less(t, closed.TTFT.P50, open.TTFT.P50, "no request waits behind the burst")

	cfg.Concurrency = -1
	_, err = Run(context.Background(), cfg, wl, KVRoutePolicy())
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestDynamoMockerScenarios(t *testing.T) {
	for _, name := range []string{"e", "f"} {
		t.Run(name, func(t *testing.T) {
			sc, err := NewScenario(name, ScenarioOptions{Seed: 1})
			require.NoError(t, err)
			require.Len(t, sc.Workload.Requests, 200)
			require.Equal(t, 8, sc.Config.Concurrency)
			results, err := Compare(context.Background(), sc.Config, sc.Workload, []Policy{mustPolicy(t, "round-robin"), mustPolicy(t, "dynamo"), KVRoutePolicy()}, 0)
			require.NoError(t, err)
			by := map[string]Result{}
			for _, r := range results {
				require.Equal(t, 200, r.Requests, r.Policy)
				require.Zero(t, r.Events.ApplyErrors+r.Events.DecodeErrors+r.Events.EncodeErrors, "%s: %+v", r.Policy, r.Events)
				by[r.Policy] = r
			}
			// A request's first token needs at least a prefill of its own
			// 128 tokens: 18.45 ms.
			for _, r := range results {
				require.GreaterOrEqual(t, r.TTFT.P50, 18*time.Millisecond, r.Policy)
			}
			require.Greater(t, by["dynamo"].HitRate, by["round-robin"].HitRate+0.1)
			require.Greater(t, by["kvroute"].HitRate, by["dynamo"].HitRate)
			require.Less(t, by["kvroute"].TTFT.P50, by["round-robin"].TTFT.P50)
		})
	}
}

func mustPolicy(t *testing.T, name string) Policy {
	t.Helper()
	p, err := PolicyByName(name)
	require.NoError(t, err)
	return p
}

func TestDynamoCostUnderRoutesAsTheDefault(t *testing.T) {
	sc, err := NewScenario("e", ScenarioOptions{Seed: 2, Requests: 80})
	require.NoError(t, err)
	under := Policy{Name: "under", Configure: func(kvroute.Clock) (router.Config, error) {
		return DynamoCostUnder(scheduling.DefaultCostConfig(), &scheduling.BoundedLoadConfig{})
	}, OwnLoad: true}
	results, err := Compare(context.Background(), sc.Config, sc.Workload, []Policy{KVRoutePolicy(), under}, 0)
	require.NoError(t, err)
	require.Equal(t, results[0].CachedTokens, results[1].CachedTokens)
	require.Equal(t, results[0].TTFT, results[1].TTFT)
	require.Equal(t, results[0].Duration, results[1].Duration)

	_, err = DynamoCostUnder(scheduling.DefaultCostConfig(), &scheduling.BoundedLoadConfig{Factor: 0.5})
	require.ErrorIs(t, err, scheduling.ErrInvalidConfig)
}
