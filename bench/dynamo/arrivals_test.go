package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestArrivals(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	req := func(prefix int) *Request { return &Request{Prefix: prefix} }
	hit := func(r Result) Result { r.PromptTokens, r.CachedTokens = 100, 90; return r }
	miss := func(r Result) Result { r.PromptTokens, r.CachedTokens = 100, 10; return r }
	ttft := func(ms int) time.Duration { return time.Duration(ms) * time.Millisecond }
	run := &Run{Results: []Result{
		// Worker 1: prompt 0 first (a miss, first of its prompt), then a
		// hit beside it, then a miss of prompt 0 again after both ended
		// (evicted there).
		miss(Result{Req: req(0), Start: at(0), Latency: 100 * time.Millisecond, Worker: 1, TTFT: ttft(40)}),
		hit(Result{Req: req(0), Start: at(10), Latency: 100 * time.Millisecond, Worker: 1, TTFT: ttft(30)}),
		miss(Result{Req: req(0), Start: at(500), Latency: 10 * time.Millisecond, Worker: 1, TTFT: ttft(45)}),
		// Worker 2: prompt 0 on an idle non-holder, then prompt 1 first
		// beside it, then prompt 0 again on worker 3 beside two there.
		miss(Result{Req: req(0), Start: at(20), Latency: 300 * time.Millisecond, Worker: 2, TTFT: ttft(46)}),
		miss(Result{Req: req(1), Start: at(30), Latency: 300 * time.Millisecond, Worker: 2, TTFT: ttft(66)}),
		hit(Result{Req: req(1), Start: at(40), Latency: 300 * time.Millisecond, Worker: 3, TTFT: ttft(20)}),
		hit(Result{Req: req(1), Start: at(41), Latency: 300 * time.Millisecond, Worker: 3, TTFT: ttft(21)}),
		miss(Result{Req: req(0), Start: at(50), Latency: 300 * time.Millisecond, Worker: 3, TTFT: ttft(70)}),
		// Worker 4, four deep: the last arrival meets three.
		hit(Result{Req: req(2), Start: at(60), Latency: time.Second, Worker: 4, TTFT: ttft(1)}),
		hit(Result{Req: req(2), Start: at(61), Latency: time.Second, Worker: 4, TTFT: ttft(2)}),
		hit(Result{Req: req(2), Start: at(62), Latency: time.Second, Worker: 4, TTFT: ttft(3)}),
		hit(Result{Req: req(2), Start: at(63), Latency: time.Second, Worker: 4, TTFT: ttft(4)}),
		// Failed requests and those without a Request are left out.
		{Req: req(0), Start: at(5), Worker: 1, Err: errTest},
		{Start: at(6), Worker: 1, PromptTokens: 100},
	}}
	a := run.arrivals()
	want := [loadBuckets][2][]time.Duration{
		{{ttft(40), ttft(46), ttft(45)}, {ttft(20), ttft(1)}},
		{{ttft(66)}, {ttft(30), ttft(21), ttft(2)}},
		{{ttft(70)}, {ttft(3)}},
		{nil, {ttft(4)}},
	}
	require.Equal(t, want, a.TTFT)
	// Prompt 2's first request was a hit (another run may have cached
	// it): only misses are classified.
	require.Equal(t, MissKinds{First: 2, Evicted: 1, Idle: 1, Busy: 1}, a.Misses)

	var sum Arrivals
	sum.add(a)
	sum.add(a)
	require.Len(t, sum.TTFT[0][0], 6)
	require.Equal(t, MissKinds{First: 4, Evicted: 2, Idle: 2, Busy: 2}, sum.Misses)

	rows := arrivalRows("s", "arm", a)
	require.Equal(t, []string{
		"| s | arm | 0 | 2, p50 1.0 ms | 3, p50 45.0 ms |",
		"| s | arm | 1 | 3, p50 21.0 ms | 1, p50 66.0 ms |",
		"| s | arm | 2 | 1, p50 3.0 ms | 1, p50 70.0 ms |",
		"| s | arm | 3 or more | 1, p50 4.0 ms | – |",
		"| s | arm | misses | first of their prompt 2, on a worker that had served it 1 | on a non-holder: idle 1, busy 1 |",
	}, rows)
	require.Equal(t, 5, strings.Count(strings.Split(arrivalHeader, "\n")[0], "|")-1)
}
