package router_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// queueRouter is a router with an admission queue of policy p over
// workers of 100 tokens per forward pass.
func queueRouter(t *testing.T, p scheduling.Policy, workers ...router.StaticWorker) *router.Router {
	t.Helper()
	r, err := router.New(router.Config{Hasher: hasher, Queue: &scheduling.QueueConfig{Policy: p}})
	require.NoError(t, err)
	for _, w := range workers {
		w.Block, w.BatchedTokens = bs, 100
		require.NoError(t, r.AddWorker(w))
	}
	return r
}

func waitDepth(t *testing.T, r *router.Router, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return r.Stats().QueueDepth == n }, 5*time.Second, time.Millisecond)
}

// A request that waited in the queue is routed on the pool as it is when
// it is admitted: not to a decode worker removed meanwhile.
func TestQueuedRequestSeesThePoolOfItsAdmission(t *testing.T) {
	r := queueRouter(t, scheduling.FCFS, router.StaticWorker{WorkerID: 1, WorkerRole: router.RolePrefill},
		router.StaticWorker{WorkerID: 11, WorkerRole: router.RoleDecode})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	big, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 0, 1, 20)}) // 320 tokens: saturated
	require.NoError(t, err)
	got := make(chan *router.Decision, 1)
	go func() {
		d, err := r.Select(ctx, &router.Request{Tokens: tokens(2, 0, 2, 2)})
		if err != nil {
			t.Error(err)
		}
		got <- d
	}()
	waitDepth(t, r, 1)
	require.True(t, r.RemoveWorker(11))
	require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 12, WorkerRole: router.RoleDecode, Block: bs, BatchedTokens: 100}))
	big.Done(router.Outcome{})
	d := <-got
	require.NotNil(t, d)
	require.Equal(t, kvroute.WorkerKey{ID: 12}, d.Worker)
	require.Equal(t, kvroute.WorkerKey{ID: 1}, d.Prefill)
	d.Done(router.Outcome{})
}

// A request whose context ends while it waits for a prefill worker is not
// routed: it is no request any more.
func TestQueuedRequestContextEnds(t *testing.T) {
	r := queueRouter(t, scheduling.FCFS, router.StaticWorker{WorkerID: 1, WorkerRole: router.RolePrefill},
		router.StaticWorker{WorkerID: 11, WorkerRole: router.RoleDecode})
	big, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 0, 1, 20)})
	require.NoError(t, err)
	defer big.Done(router.Outcome{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	d, err := r.Select(ctx, &router.Request{Tokens: tokens(2, 0, 2, 2)})
	require.ErrorIs(t, err, context.DeadlineExceeded, "routed to %v", d)
}

// WSPT admits equal jobs in arrival order, also after a release sent the
// first back to wait (the workers saturated still).
func TestWSPTTiesKeepArrivalOrder(t *testing.T) {
	r := queueRouter(t, scheduling.WSPT, router.StaticWorker{WorkerID: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	small, err := r.Select(ctx, &router.Request{Tokens: tokens(9, 0, 9, 1)})
	require.NoError(t, err)
	big, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 0, 1, 20)})
	require.NoError(t, err)
	order := make(chan string, 2)
	run := func(name string, user int) {
		d, err := r.Select(ctx, &router.Request{Tokens: tokens(3, 0, user, 7)})
		if err != nil {
			t.Error(err)
			return
		}
		order <- name
		d.Done(router.Outcome{})
	}
	go run("A", 10)
	waitDepth(t, r, 1)
	go run("B", 11)
	waitDepth(t, r, 2)
	small.Done(router.Outcome{}) // releases A, which finds the worker saturated and waits again
	waitDepth(t, r, 2)
	big.Done(router.Outcome{})
	require.Equal(t, "A", <-order)
	require.Equal(t, "B", <-order)
}

// A request that finds the workers saturated while the load that fills
// them is freed is admitted: the release is not lost between its look at
// the loads and its place in the queue.
func TestNoLostWakeUp(t *testing.T) {
	r := queueRouter(t, scheduling.FCFS, router.StaticWorker{WorkerID: 1})
	for i := range 3000 {
		big, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 0, i, 20)})
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			d, err := r.Select(ctx, &router.Request{Tokens: tokens(2, 0, i, 1)})
			if err == nil {
				d.Done(router.Outcome{})
			}
			done <- err
		}()
		big.Done(router.Outcome{})
		require.NoError(t, <-done, "iteration %d: waited with the worker idle", i)
	}
}

// In a pool of prefill, decode and aggregated workers, a pin to an
// aggregated worker sends the whole request there.
func TestPinToAggregatedWorkerInAMixedPool(t *testing.T) {
	p, dc, ag := newEngine(1), newEngine(2), newEngine(3)
	p.role, dc.role = router.RolePrefill, router.RoleDecode
	r := newRouter(t, router.Config{}, p, dc, ag)
	d, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 2, 0, 0), Pin: kvroute.WorkerKey{ID: 3}, HasPin: true})
	require.NoError(t, err)
	require.Equal(t, kvroute.WorkerKey{ID: 3}, d.Worker)
	require.False(t, d.Disaggregated)
	d.Done(router.Outcome{})
}

// A disaggregated decision counts for its prefill worker and its decode
// worker.
func TestPrefillDecisionsCounted(t *testing.T) {
	p, dc := newEngine(1), newEngine(2)
	p.role, dc.role = router.RolePrefill, router.RoleDecode
	r := newRouter(t, router.Config{}, p, dc)
	d, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 2, 0, 0)})
	require.NoError(t, err)
	require.True(t, d.Disaggregated)
	d.Done(router.Outcome{})
	for _, w := range r.Stats().Workers {
		require.EqualValues(t, 1, w.Decisions, "worker %v", w.Worker)
	}
}

// A request pinned to a decode worker while every prefill worker is busy
// is prefilled by its decode worker, as in an aggregated pool: the busy
// prefill workers are no reason to refuse the pin.
func TestPinToDecodeWorkerWithPrefillBusy(t *testing.T) {
	p, dc := newEngine(1), newEngine(2)
	p.role, dc.role = router.RolePrefill, router.RoleDecode
	r := newRouter(t, router.Config{Busy: scheduling.BusyThresholds{MaxPrefillTokens: 100}}, p, dc)
	ctx := context.Background()
	busy, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 0, 1, 20), Pin: kvroute.WorkerKey{ID: 1}, HasPin: true})
	require.NoError(t, err)
	defer busy.Done(router.Outcome{})
	d, err := r.Select(ctx, &router.Request{Tokens: tokens(2, 0, 2, 2), Pin: kvroute.WorkerKey{ID: 2}, HasPin: true})
	require.NoError(t, err)
	require.Equal(t, kvroute.WorkerKey{ID: 2}, d.Worker)
	require.False(t, d.Disaggregated)
	d.Done(router.Outcome{})
}
