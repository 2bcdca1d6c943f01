package main

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	kvbench "github.com/kvroute/kvroute/bench"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
	"github.com/stretchr/testify/require"
)

func TestScenarios(t *testing.T) {
	for _, name := range ScenarioNames {
		t.Run(name, func(t *testing.T) {
			cfg := scenarioConfig{requests: 60, concurrency: 8, seed: 1}
			a, err := NewScenario(name, cfg)
			require.NoError(t, err)
			b, err := NewScenario(name, cfg)
			require.NoError(t, err)
			require.Equal(t, a.Requests, b.Requests, "the same seed gives the same workload")
			require.NotEmpty(t, a.Requests)
			require.Positive(t, a.CacheBlocks)
			turns := map[int]int{}
			for _, r := range a.Requests {
				require.Equal(t, turns[r.Conv], r.Turn, "turns of a conversation in order")
				turns[r.Conv]++
				require.Equal(t, "system", r.Messages[0].Role)
				require.Equal(t, "user", r.Messages[len(r.Messages)-1].Role)
			}
		})
	}
	_, err := NewScenario("nope", scenarioConfig{requests: 1, concurrency: 1})
	require.Error(t, err)
	_, err = NewScenario(ScenarioNames[0], scenarioConfig{})
	require.Error(t, err)
}

func TestMultiTurnHistoryGrows(t *testing.T) {
	s, err := NewScenario("multi-turn", scenarioConfig{requests: 12, concurrency: 2, seed: 3})
	require.NoError(t, err)
	require.Len(t, s.Requests, 12)
	for i := 1; i < 6; i++ {
		prev, cur := s.Requests[i-1], s.Requests[i]
		require.Equal(t, prev.Messages, cur.Messages[:len(prev.Messages)], "turn %d extends turn %d", i, i-1)
		require.Len(t, cur.Messages, len(prev.Messages)+2)
	}
}

func TestReadStream(t *testing.T) {
	stream := `data: {"choices":[{"delta":{"content":"a","role":"assistant"}}],"nvext":{"worker_id":{"prefill_worker_id":7,"decode_worker_id":7}}}

data: {"choices":[{"delta":{"content":"b"}}]}

data: {"choices":[],"usage":{"prompt_tokens":322,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":320}}}

data: [DONE]
`
	var content string
	var worker uint64
	var cached, prompt int
	require.NoError(t, readStream(strings.NewReader(stream), func(c *chunk) {
		for _, ch := range c.Choices {
			content += ch.Delta.Content
		}
		if c.NVExt != nil && c.NVExt.WorkerID != nil {
			worker = c.NVExt.WorkerID.DecodeWorkerID
		}
		if c.Usage != nil {
			prompt, cached = c.Usage.PromptTokens, c.Usage.PromptTokensDetails.CachedTokens
		}
	}))
	require.Equal(t, "ab", content)
	require.Equal(t, uint64(7), worker)
	require.Equal(t, 322, prompt)
	require.Equal(t, 320, cached)

	require.ErrorContains(t, readStream(strings.NewReader("data: {\"choices\":[]}\n"), func(*chunk) {}), "before [DONE]")
	require.ErrorContains(t, readStream(strings.NewReader("data: {nope\n"), func(*chunk) {}), "bad chunk")
}

func TestUneven(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	res := func(w uint64, start, end int) Result {
		return Result{Worker: w, Start: at(start), Latency: time.Duration(end-start) * time.Second}
	}
	tests := []struct {
		name    string
		workers int
		results []Result
		want    float64
	}{
		{"no requests", 2, nil, 0},
		{"one each", 2, []Result{res(1, 0, 10), res(2, 0, 10)}, 0},
		{
			// Worker 1 holds two requests from 0 to 4 while worker 2 is
			// idle: 4 of 10 seconds in flight.
			"two on one, other idle", 2, []Result{res(1, 0, 4), res(1, 0, 10)}, 0.4,
		},
		{
			// A third worker that never got a request counts as idle.
			"unseen worker is idle", 3, []Result{res(1, 0, 10), res(1, 0, 10), res(2, 0, 10)}, 1,
		},
		{
			// Gaps with nothing in flight do not count; a request that ends
			// as another starts does not overlap it.
			"gaps and back to back", 1, []Result{res(1, 0, 2), res(1, 2, 4), res(1, 10, 12)}, 0,
		},
		{"failed requests are left out", 2, []Result{res(1, 0, 10), res(1, 0, 10), {Err: errTest}}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run := &Run{Results: tc.results}
			require.InDelta(t, tc.want, run.uneven(tc.workers), 1e-9)
		})
	}
}

func TestSummarize(t *testing.T) {
	run := &Run{Wall: 2 * time.Second}
	for i := range 10 {
		run.Results = append(run.Results, Result{
			TTFT: time.Duration(i+1) * time.Millisecond, PromptTokens: 100, CachedTokens: 50,
			Worker: uint64(i % 3), Predicted: 48 + i,
		})
	}
	run.Results = append(run.Results, Result{Err: errTest})
	s := run.Summarize(3, 16)
	require.Equal(t, 5*time.Millisecond, s.TTFTp50)
	require.Equal(t, 10*time.Millisecond, s.TTFTp99)
	require.InDelta(t, 5.0, s.Throughput, 1e-9)
	require.InDelta(t, 0.5, s.CachedFraction, 1e-9)
	require.Equal(t, []int{4, 3, 3}, s.PerWorker)
	require.Equal(t, 10, s.Predicted)
	require.Equal(t, 10, s.Exact) // 48..57 are all within 16 of 50
	require.Equal(t, 525, s.PredictedTokens)
	require.Equal(t, 500, s.ActualTokens)
}

var errTest = errorString("failed")

type errorString string

func (e errorString) Error() string { return string(e) }

func TestSplit(t *testing.T) {
	require.Equal(t, []string{"a", "b"}, split(" a, ,b "))
	require.Nil(t, split(""))
}

func TestLibPolicies(t *testing.T) {
	for _, name := range libPolicyNames() {
		cfg, p, err := libConfig(name)
		require.NoError(t, err, name)
		if name != "default" {
			require.NotNil(t, cfg.Cost, name)
		}
		require.Equal(t, strings.Contains(name, "-own"), p.OwnLoad, name)
		require.Equal(t, strings.Contains(name, "-fresh"), p.FreshLoad > 0, name)
		require.Equal(t, strings.Contains(name, "-drop"), p.ReportFilter != nil, name)
		_, ok := armSpecOf("kvroute-lib:" + name)
		require.True(t, ok, name)
	}
	_, _, err := libConfig("nope")
	require.Error(t, err)
}

// reportingRouter returns a router with one worker, the worker, and a
// function that returns the load the router holds as the worker's report.
func reportingRouter(t *testing.T) (*router.Router, kvroute.WorkerKey, func() scheduling.Load) {
	t.Helper()
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	w := kvroute.WorkerKey{ID: 1}
	require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 1, Block: 16}))
	reported := func() scheduling.Load {
		for _, ws := range r.Stats().Workers {
			if ws.Worker == w {
				return ws.Reported
			}
		}
		t.Fatal("worker missing from the router's stats")
		return scheduling.Load{}
	}
	return r, w, reported
}

func TestFreshLoad(t *testing.T) {
	r, w, reported := reportingRouter(t)
	rep, stop := loadReporter(r, kvbench.Policy{FreshLoad: 50 * time.Millisecond})
	defer stop()
	busy := scheduling.Load{ActiveRequests: 3, ActivePrefillTokens: 900, KVCapacityBlocks: 800}
	require.NoError(t, rep.Heartbeat(w, busy))
	require.Equal(t, busy, reported(), "a fresh report counts")
	require.Eventually(t, func() bool {
		return reported() == scheduling.Load{KVCapacityBlocks: 800}
	}, 5*time.Second, 5*time.Millisecond, "a stale report keeps only its capacities")
	require.Error(t, rep.Heartbeat(kvroute.WorkerKey{ID: 2}, busy), "an unknown worker's report is refused")

	own, stopOwn := loadReporter(r, kvbench.Policy{OwnLoad: true})
	defer stopOwn()
	require.NoError(t, own.Heartbeat(w, busy))
	require.Equal(t, scheduling.Load{KVCapacityBlocks: 800}, reported())
}

func TestReportFilter(t *testing.T) {
	r, w, reported := reportingRouter(t)
	busy := scheduling.Load{ActiveRequests: 3, QueueDepth: 1, ActivePrefillTokens: 900, ActiveDecodeBlocks: 300, KVCapacityBlocks: 800}
	tests := []struct {
		name   string
		policy kvbench.Policy
		want   scheduling.Load
	}{
		{"prefill dropped", kvbench.Policy{ReportFilter: kvbench.WithoutReportedPrefill},
			scheduling.Load{ActiveRequests: 3, QueueDepth: 1, ActiveDecodeBlocks: 300, PotentialDecodeBlocks: 0, KVCapacityBlocks: 800}},
		{"requests dropped", kvbench.Policy{ReportFilter: kvbench.WithoutReportedRequests},
			scheduling.Load{ActivePrefillTokens: 900, ActiveDecodeBlocks: 300, KVCapacityBlocks: 800}},
		{"requests dropped, then counted while fresh", kvbench.Policy{ReportFilter: kvbench.WithoutReportedRequests, FreshLoad: time.Minute},
			scheduling.Load{ActivePrefillTokens: 900, ActiveDecodeBlocks: 300, KVCapacityBlocks: 800}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, stop := loadReporter(r, tt.policy)
			defer stop()
			require.NoError(t, rep.Heartbeat(w, busy))
			require.Equal(t, tt.want, reported())
		})
	}
}
