package router_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// What routing takes from an engine's load report under each
// Config.LoadReports: capacities always, counts only when merged.
func TestLoadReportModes(t *testing.T) {
	busyReport := scheduling.Load{
		ActiveRequests: 5, ActivePrefillTokens: 3000, ActiveDecodeBlocks: 400, PotentialDecodeBlocks: 401,
		QueueDepth: 2, KVUtilization: 0.5,
		KVCapacityBlocks: 800, MaxBatchedTokens: 2048, PrefillTokensPerSecond: 9000, // MaxRequests unreported
	}
	// The router's own request on worker 1: 4 blocks, 64 tokens still to
	// prefill. The request explained adds 2 blocks of its own.
	own := scheduling.Load{ActiveRequests: 1, ActivePrefillTokens: 64, ActiveDecodeBlocks: 4, PotentialDecodeBlocks: 6}
	static := scheduling.Load{MaxBatchedTokens: 512, MaxRequests: 64, KVCapacityBlocks: 1000}
	with := func(l scheduling.Load, f func(*scheduling.Load)) scheduling.Load { f(&l); return l }
	tests := []struct {
		name   string
		mode   router.LoadReportMode
		report *scheduling.Load // nil: no report
		want   scheduling.Load
	}{
		{name: "no report: own counts, the worker's capacities", mode: router.LoadReportCapacities,
			want: with(own, func(l *scheduling.Load) { l.MaxBatchedTokens, l.MaxRequests, l.KVCapacityBlocks = 512, 64, 1000 })},
		{name: "no report, merged: the same", mode: router.LoadReportMerged,
			want: with(own, func(l *scheduling.Load) { l.MaxBatchedTokens, l.MaxRequests, l.KVCapacityBlocks = 512, 64, 1000 })},
		{name: "capacities: reported capacities win, counts are the router's own", mode: router.LoadReportCapacities, report: &busyReport,
			want: with(own, func(l *scheduling.Load) {
				l.MaxBatchedTokens, l.MaxRequests, l.KVCapacityBlocks, l.PrefillTokensPerSecond = 2048, 64, 800, 9000
			})},
		{name: "capacities: a report without capacities keeps the worker's", mode: router.LoadReportCapacities,
			report: &scheduling.Load{ActiveRequests: 9, QueueDepth: 3},
			want:   with(own, func(l *scheduling.Load) { l.MaxBatchedTokens, l.MaxRequests, l.KVCapacityBlocks = 512, 64, 1000 })},
		{name: "merged: the larger counts and the engine's queue and utilisation", mode: router.LoadReportMerged, report: &busyReport,
			want: scheduling.Load{
				ActiveRequests: 5, ActivePrefillTokens: 3000, ActiveDecodeBlocks: 400, PotentialDecodeBlocks: 6 + 396,
				QueueDepth: 2, KVUtilization: 0.5,
				KVCapacityBlocks: 800, MaxBatchedTokens: 2048, MaxRequests: 64, PrefillTokensPerSecond: 9000,
			}},
		{name: "merged: a report below the router's counts leaves them", mode: router.LoadReportMerged,
			report: &scheduling.Load{ActiveRequests: 0, ActiveDecodeBlocks: 1, KVCapacityBlocks: 700},
			want:   with(own, func(l *scheduling.Load) { l.MaxBatchedTokens, l.MaxRequests, l.KVCapacityBlocks = 512, 64, 700 })},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := router.New(router.Config{Hasher: hasher, LoadReports: tc.mode})
			require.NoError(t, err)
			w1 := kvroute.WorkerKey{ID: 1}
			require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 1, Block: bs, BatchedTokens: static.MaxBatchedTokens,
				Requests: static.MaxRequests, CapacityBlocks: static.KVCapacityBlocks}))
			require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 2, Block: bs}))
			ctx := context.Background()
			d, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 4, 0, 0), Pin: w1, HasPin: true})
			require.NoError(t, err)
			defer d.Done(router.Outcome{})
			if tc.report != nil {
				require.NoError(t, r.Heartbeat(w1, *tc.report))
			}
			e, err := r.Select(ctx, &router.Request{Tokens: tokens(2, 2, 0, 0), Explain: true})
			require.NoError(t, err)
			defer e.Done(router.Outcome{})
			require.Len(t, e.Candidates, 2)
			require.Equal(t, w1, e.Candidates[0].Worker)
			require.Equal(t, tc.want, e.Candidates[0].Load)
			if tc.report != nil {
				// Stats show the whole report whatever routing takes.
				require.Equal(t, *tc.report, r.Stats().Workers[0].Reported)
			}
		})
	}
}

// A stale busy report from the worker holding the prompt's prefix sends the
// request away only when reports are merged.
func TestLoadReportModeDecides(t *testing.T) {
	for _, tc := range []struct {
		mode router.LoadReportMode
		want kvroute.WorkerID
	}{
		{mode: router.LoadReportCapacities, want: 1},
		{mode: router.LoadReportMerged, want: 2},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			es := []*engine{newEngine(1), newEngine(2)}
			r := newRouter(t, router.Config{LoadReports: tc.mode}, es...)
			es[0].serve(t, r, tokens(1, 32, 0, 0))
			require.NoError(t, r.Heartbeat(kvroute.WorkerKey{ID: 1}, scheduling.Load{ActiveRequests: 3, ActivePrefillTokens: 8000}))
			d, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 32, 1, 2)})
			require.NoError(t, err)
			require.Equal(t, kvroute.WorkerKey{ID: tc.want}, d.Worker)
			d.Done(router.Outcome{})
		})
	}
}

func TestLoadReportModeInvalid(t *testing.T) {
	_, err := router.New(router.Config{LoadReports: router.LoadReportMerged + 1})
	require.ErrorIs(t, err, router.ErrInvalidConfig)
	require.Equal(t, "LoadReportMode(2)", (router.LoadReportMerged + 1).String())
}

// A mode reads from and writes to its name, in flags and JSON alike.
func TestLoadReportModeText(t *testing.T) {
	for _, tc := range []struct {
		text string
		want router.LoadReportMode
	}{{"capacities", router.LoadReportCapacities}, {"merged", router.LoadReportMerged}} {
		var m router.LoadReportMode
		require.NoError(t, m.UnmarshalText([]byte(tc.text)))
		require.Equal(t, tc.want, m)
		out, err := m.MarshalText()
		require.NoError(t, err)
		require.Equal(t, tc.text, string(out))
		var fromJSON struct{ Mode router.LoadReportMode }
		require.NoError(t, json.Unmarshal([]byte(`{"Mode":"`+tc.text+`"}`), &fromJSON))
		require.Equal(t, tc.want, fromJSON.Mode)
	}
	var m router.LoadReportMode
	require.ErrorIs(t, m.UnmarshalText([]byte("max")), router.ErrInvalidConfig)
	_, err := (router.LoadReportMerged + 1).MarshalText()
	require.ErrorIs(t, err, router.ErrInvalidConfig)
}
