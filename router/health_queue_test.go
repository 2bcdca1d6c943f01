package router_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// An engine whose health endpoint answers while its inference fails must
// stay out of rotation: heartbeats keep it alive but do not clear errors.
func TestHeartbeatDoesNotForgiveErrors(t *testing.T) {
	clock := newClock()
	r := newRouter(t, router.Config{Clock: clock}, newEngine(1), newEngine(2))
	w1 := kvroute.WorkerKey{ID: 1}
	for range 5 {
		require.NoError(t, r.ReportError(w1, errors.New("inference failed")))
	}
	for range 5 { // the gateway probes every 2 s
		clock.Advance(2 * time.Second)
		require.NoError(t, r.Heartbeat(w1, scheduling.Load{}))
		r.CheckHealth()
		h, _ := r.Health(w1)
		require.Equal(t, router.Unhealthy, h, "a heartbeat forgave inference errors")
	}
	// A successful request restores it.
	d, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 4, 0, 0), Pin: w1, HasPin: true})
	require.ErrorIs(t, err, router.ErrPinnedUnavailable) // unhealthy: not chosen, even pinned
	require.Nil(t, d)
	clock.Advance(16 * time.Second) // UnhealthyAfter without a new error: probed again
	require.NoError(t, r.Heartbeat(w1, scheduling.Load{}))
	r.CheckHealth()
	d, err = r.Select(context.Background(), &router.Request{Tokens: tokens(1, 4, 0, 0), Pin: w1, HasPin: true})
	require.NoError(t, err)
	d.Done(router.Outcome{})
	h, _ := r.Health(w1)
	require.Equal(t, router.Healthy, h)
}

// Heartbeats and errors recorded while UpdateWorker swaps a worker's
// description are kept.
func TestUpdateWorkerKeepsConcurrentReports(t *testing.T) {
	r := newRouter(t, router.Config{Health: router.HealthConfig{DegradedErrors: 1 << 20, UnhealthyErrors: 1 << 21}})
	w := router.StaticWorker{WorkerID: 1, Block: bs, Requests: 8}
	require.NoError(t, r.AddWorker(w))
	key := kvroute.WorkerKey{ID: 1}
	const n = 2000
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			w.Requests = 8 + i%2
			require.NoError(t, r.UpdateWorker(w))
		}
	})
	for i := 1; i <= n; i++ {
		require.NoError(t, r.Heartbeat(key, scheduling.Load{QueueDepth: i}))
	}
	close(stop)
	wg.Wait()
	st := r.Stats()
	require.Len(t, st.Workers, 1)
	require.Equal(t, n, st.Workers[0].Reported.QueueDepth, "the last heartbeat was lost in an update")
}

// When load drops, the queue admits every waiting request the freed
// capacity holds, not one per drop.
func TestQueueAdmitsWhatFreedCapacityHolds(t *testing.T) {
	r, err := router.New(router.Config{Hasher: hasher, Queue: &scheduling.QueueConfig{}})
	require.NoError(t, err)
	require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 1, Block: bs, BatchedTokens: 512}))
	ctx := context.Background()
	// 40 blocks = 640 prefill tokens: above the 512-token budget.
	big, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 0, 1, 40)})
	require.NoError(t, err)
	const waiters = 3
	admitted := make(chan *router.Decision, waiters)
	for i := range waiters {
		go func() {
			d, err := r.Select(ctx, &router.Request{Tokens: tokens(2, 0, 10+i, 4)}) // 64 tokens each
			if err != nil {
				t.Error(err)
			}
			admitted <- d
		}()
	}
	require.Eventually(t, func() bool { return r.Stats().QueueDepth == waiters }, 10*time.Second, time.Millisecond)
	big.PrefillDone() // drains to 0 of 512: room for all three
	timeout := time.After(10 * time.Second)
	for range waiters {
		select {
		case d := <-admitted:
			defer d.Done(router.Outcome{})
		case <-timeout:
			t.Fatalf("%d requests still wait with the worker drained", r.Stats().QueueDepth)
		}
	}
	require.Zero(t, r.Stats().QueueDepth)
	big.Done(router.Outcome{})
}

// recordingSync is a LoadSync that keeps what it is told, as a peer would.
type recordingSync struct {
	mu     sync.Mutex
	active map[scheduling.RequestID]int // id → prefill tokens, -1 once prefilled
	output map[scheduling.RequestID]int
}

func (s *recordingSync) Added(id scheduling.RequestID, _ kvroute.WorkerKey, _ []kvroute.SeqHash, prefill int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active[id] = prefill
}

func (s *recordingSync) PrefillDone(id scheduling.RequestID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active[id] = -1
}

func (s *recordingSync) OutputTokens(id scheduling.RequestID, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.output[id] += n
}

func (s *recordingSync) Freed(id scheduling.RequestID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.active, id)
}

func TestLoadSyncSeesEveryChange(t *testing.T) {
	sync := &recordingSync{active: map[scheduling.RequestID]int{}, output: map[scheduling.RequestID]int{}}
	r := newRouter(t, router.Config{LoadSync: sync}, newEngine(1))
	d, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 4, 0, 0)})
	require.NoError(t, err)
	require.Len(t, sync.active, 1)
	for _, p := range sync.active {
		require.Equal(t, 4*bs, p)
	}
	d.PrefillDone()
	d.AddOutputTokens(40)
	for id, p := range sync.active {
		require.Equal(t, -1, p)
		require.Equal(t, 40, sync.output[id])
	}
	d.Done(router.Outcome{})
	d.Done(router.Outcome{})
	require.Empty(t, sync.active)
}

// An outcome's error is a verdict on the worker's health unless the
// client went away or the host says it is none (ErrNoVerdict): those
// neither add an error nor clear the count.
func TestOutcomeVerdicts(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		want     router.Health
		failures uint64
	}{
		{"success clears the errors", nil, router.Healthy, 0},
		{"failure counts", errors.New("500 internal error"), router.Unhealthy, 1},
		{"cancellation is no verdict", fmt.Errorf("client gone: %w", context.Canceled), router.Degraded, 0},
		{"no verdict", fmt.Errorf("%w: engine answered 429", router.ErrNoVerdict), router.Degraded, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, router.Config{Health: router.HealthConfig{DegradedErrors: 3, UnhealthyErrors: 5}}, newEngine(1))
			w1 := kvroute.WorkerKey{ID: 1}
			for range 4 {
				require.NoError(t, r.ReportError(w1, errors.New("connection refused")))
			}
			d, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 4, 0, 0)})
			require.NoError(t, err)
			d.Done(router.Outcome{Err: tt.err})
			h, _ := r.Health(w1)
			require.Equal(t, tt.want, h)
			require.Equal(t, tt.failures, r.Stats().Failures)
		})
	}
}
