package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
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
