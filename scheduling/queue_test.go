package scheduling_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

func newQueue(t testing.TB, cfg scheduling.QueueConfig) *scheduling.Queue {
	t.Helper()
	q, err := scheduling.NewQueue(cfg)
	require.NoError(t, err)
	return q
}

// named is an Item with a name for order assertions.
type named struct {
	name string
	item scheduling.Item
}

// admissionOrder queues the items one by one (each fully queued before the
// next), then releases them one at a time and returns the order in which
// their Wait calls returned.
func admissionOrder(t *testing.T, q *scheduling.Queue, items []named) []string {
	t.Helper()
	done := make(chan string, len(items))
	for i, it := range items {
		go func() {
			if err := q.Wait(context.Background(), it.item, true); err != nil {
				t.Error(err)
			}
			done <- it.name
		}()
		require.Eventually(t, func() bool { return q.Len() == i+1 }, 5*time.Second, time.Millisecond)
	}
	var order []string
	for range items {
		require.Equal(t, 1, q.Release(1))
		order = append(order, <-done)
	}
	require.Zero(t, q.Release(1))
	return order
}

func TestQueuePolicies(t *testing.T) {
	clock := newManualClock()
	t0 := clock.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	// long: 8192 new tokens, arrived first. short: 4096-token prompt with
	// 3840 cached, 256 new, arrived 1 s later. mid: 1024 new tokens, 2 s.
	long := named{"long", scheduling.Item{Arrival: at(0), NewTokens: 8192}}
	short := named{"short", scheduling.Item{Arrival: at(1), NewTokens: 4096 - 3840}}
	mid := named{"mid", scheduling.Item{Arrival: at(2), NewTokens: 1024}}
	// bumped arrived last, but a 5 s priority jump puts it ahead under FCFS.
	bumped := named{"bumped", scheduling.Item{Arrival: at(3), NewTokens: 8192, PriorityJump: 5}}

	tests := []struct {
		policy scheduling.Policy
		scores []float64 // of long, short, mid, bumped
		order  []string
	}{
		{scheduling.FCFS, []float64{0, -1, -2, 5 - 3}, []string{"bumped", "long", "short", "mid"}},
		{scheduling.LCFS, []float64{0, 1, 2, 5 + 3}, []string{"bumped", "mid", "short", "long"}},
		{scheduling.WSPT, []float64{1.0 / 8192, 1.0 / 256, 1.0 / 1024, 6.0 / 8192}, []string{"short", "mid", "bumped", "long"}},
	}
	for _, tt := range tests {
		t.Run(tt.policy.String(), func(t *testing.T) {
			q := newQueue(t, scheduling.QueueConfig{Policy: tt.policy, Clock: clock})
			require.Equal(t, tt.policy, q.Policy())
			var scores []float64
			for _, it := range []named{long, short, mid, bumped} {
				scores = append(scores, q.Score(it.item))
			}
			require.InDeltaSlice(t, tt.scores, scores, 1e-12)
			require.Equal(t, tt.order, admissionOrder(t, q, []named{long, short, mid, bumped}))
		})
	}
}

func TestQueueStrictPriority(t *testing.T) {
	clock := newManualClock()
	q := newQueue(t, scheduling.QueueConfig{Policy: scheduling.WSPT, Clock: clock})
	order := admissionOrder(t, q, []named{
		{"tiny", scheduling.Item{NewTokens: 1, PriorityJump: 1000}},
		{"huge-high", scheduling.Item{NewTokens: 100_000, Priority: 2}},
		{"mid-high", scheduling.Item{NewTokens: 10_000, Priority: 1}},
		{"small-high", scheduling.Item{NewTokens: 10, Priority: 1}},
	})
	require.Equal(t, []string{"huge-high", "small-high", "mid-high", "tiny"}, order)
}

func TestQueueEqualScoresKeepArrivalOrder(t *testing.T) {
	q := newQueue(t, scheduling.QueueConfig{Policy: scheduling.WSPT, Clock: newManualClock()})
	order := admissionOrder(t, q, []named{
		{"a", scheduling.Item{NewTokens: 100}}, {"b", scheduling.Item{NewTokens: 100}}, {"c", scheduling.Item{NewTokens: 100}},
	})
	require.Equal(t, []string{"a", "b", "c"}, order)
}

func TestQueueScoreEdgeCases(t *testing.T) {
	clock := newManualClock()
	fcfs := newQueue(t, scheduling.QueueConfig{Clock: clock})
	wspt := newQueue(t, scheduling.QueueConfig{Policy: scheduling.WSPT, Clock: clock})
	clock.Advance(10 * time.Second)
	require.Equal(t, -10.0, fcfs.Score(scheduling.Item{}))                         // zero arrival means now
	require.Equal(t, -10.0, fcfs.Score(scheduling.Item{PriorityJump: -5}))         // negative jump counts as zero
	require.Equal(t, -10.0, fcfs.Score(scheduling.Item{PriorityJump: math.NaN()})) // so does NaN
	require.Equal(t, 1.0, wspt.Score(scheduling.Item{NewTokens: -300}))            // fully cached
	require.Equal(t, 3.0/512, wspt.Score(scheduling.Item{NewTokens: 512, PriorityJump: 2}))
	// The expected output is part of the job.
	require.Equal(t, 1.0/612, wspt.Score(scheduling.Item{NewTokens: 512, OutputTokens: 100}))
	weighted := newQueue(t, scheduling.QueueConfig{Policy: scheduling.WSPT, OutputTokenWeight: 4, Clock: clock})
	require.Equal(t, 1.0/912, weighted.Score(scheduling.Item{NewTokens: 512, OutputTokens: 100}))
	require.Greater(t, weighted.Score(scheduling.Item{NewTokens: 512, OutputTokens: 10}),
		weighted.Score(scheduling.Item{NewTokens: 100, OutputTokens: 200}), "a short answer goes first")
	_, err := scheduling.NewQueue(scheduling.QueueConfig{OutputTokenWeight: -1})
	require.ErrorIs(t, err, scheduling.ErrInvalidConfig)
}

func TestNewItem(t *testing.T) {
	arrival := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	req := scheduling.Request{PromptTokens: 4096, BlockSize: 16, Priority: 3, PriorityJump: 1.5, Arrival: arrival, ExpectedOutputTokens: 77}
	cands := []scheduling.Candidate{
		{Cached: [kvroute.NumTiers]int{100}},
		{Cached: [kvroute.NumTiers]int{200, 40}},
		{},
	}
	require.Equal(t, scheduling.Item{Priority: 3, PriorityJump: 1.5, Arrival: arrival, NewTokens: 4096 - 240*16, OutputTokens: 77}, scheduling.NewItem(&req, cands))
	req.BlockSize = 0
	require.Equal(t, 4096-240*scheduling.DefaultBlockSize, scheduling.NewItem(&req, cands).NewTokens)
}

func TestQueueSaturated(t *testing.T) {
	q := newQueue(t, scheduling.QueueConfig{Threshold: 1.5})
	mk := func(loads ...[2]int) []scheduling.Candidate {
		out := make([]scheduling.Candidate, len(loads))
		for i, l := range loads {
			out[i].Load = scheduling.Load{ActivePrefillTokens: l[0], MaxBatchedTokens: l[1]}
		}
		return out
	}
	tests := []struct {
		name  string
		cands []scheduling.Candidate
		want  bool
	}{
		{"no candidates", nil, false},
		{"all above 1.5x", mk([2]int{12289, 8192}, [2]int{3100, 2048}), true},
		{"one at exactly 1.5x", mk([2]int{12289, 8192}, [2]int{3072, 2048}), false},
		{"unknown budget never saturates", mk([2]int{12289, 8192}, [2]int{1 << 30, 0}), false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, q.Saturated(tt.cands), tt.name)
	}
}

func TestQueueFastPathAndUnsaturatedArrival(t *testing.T) {
	q := newQueue(t, scheduling.QueueConfig{Clock: newManualClock()})
	require.NoError(t, q.Wait(context.Background(), scheduling.Item{}, false))
	require.Zero(t, q.Len())

	// With a request waiting, an unsaturated arrival queues behind it and
	// releases the best waiter: the earlier one.
	first := make(chan error, 1)
	go func() { first <- q.Wait(context.Background(), scheduling.Item{}, true) }()
	require.Eventually(t, func() bool { return q.Len() == 1 }, 5*time.Second, time.Millisecond)
	second := make(chan error, 1)
	go func() { second <- q.Wait(context.Background(), scheduling.Item{}, false) }()
	require.NoError(t, <-first)
	require.Eventually(t, func() bool { return q.Len() == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 1, q.Release(5))
	require.NoError(t, <-second)
}

func TestQueueCancel(t *testing.T) {
	q := newQueue(t, scheduling.QueueConfig{Clock: newManualClock()})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- q.Wait(ctx, scheduling.Item{}, true) }()
	require.Eventually(t, func() bool { return q.Len() == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	err := <-errc
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, q.Len())
	require.Zero(t, q.Release(1))

	// An expired deadline before queueing.
	ctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	require.ErrorIs(t, q.Wait(ctx, scheduling.Item{}, true), context.DeadlineExceeded)
	require.Zero(t, q.Len())
}

func TestQueueCancelAfterReleasePassesAdmissionOn(t *testing.T) {
	// Many rounds of a race between Release and cancellation: whoever
	// loses, the other waiter must be admitted by the single Release.
	q := newQueue(t, scheduling.QueueConfig{Clock: newManualClock()})
	for range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		a := make(chan error, 1)
		go func() { a <- q.Wait(ctx, scheduling.Item{}, true) }()
		require.Eventually(t, func() bool { return q.Len() == 1 }, 5*time.Second, time.Millisecond)
		b := make(chan error, 1)
		go func() { b <- q.Wait(context.Background(), scheduling.Item{}, true) }()
		require.Eventually(t, func() bool { return q.Len() == 2 }, 5*time.Second, time.Millisecond)
		go cancel()
		q.Release(1)
		errA := <-a
		if errA == nil {
			// a was admitted before it saw the cancellation; b still waits.
			require.Equal(t, 1, q.Release(1))
		}
		require.NoError(t, <-b)
		require.Zero(t, q.Len())
	}
}

func TestQueueFull(t *testing.T) {
	q := newQueue(t, scheduling.QueueConfig{Capacity: 2, Clock: newManualClock()})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { require.NoError(t, q.Wait(context.Background(), scheduling.Item{}, true)) })
	}
	require.Eventually(t, func() bool { return q.Len() == 2 }, 5*time.Second, time.Millisecond)
	err := q.Wait(context.Background(), scheduling.Item{}, true)
	require.ErrorIs(t, err, scheduling.ErrQueueFull)
	var full *scheduling.QueueFullError
	require.True(t, errors.As(err, &full))
	require.Equal(t, 2, full.Capacity)
	require.Equal(t, 2, q.Release(10))
	wg.Wait()
}

func TestQueueClose(t *testing.T) {
	q := newQueue(t, scheduling.QueueConfig{Clock: newManualClock()})
	errc := make(chan error, 1)
	go func() { errc <- q.Wait(context.Background(), scheduling.Item{}, true) }()
	require.Eventually(t, func() bool { return q.Len() == 1 }, 5*time.Second, time.Millisecond)
	q.Close()
	q.Close()
	require.ErrorIs(t, <-errc, scheduling.ErrQueueClosed)
	require.ErrorIs(t, q.Wait(context.Background(), scheduling.Item{}, true), scheduling.ErrQueueClosed)
	// Admission without waiting still works: the queue is empty and there is room.
	require.NoError(t, q.Wait(context.Background(), scheduling.Item{}, false))
}

func TestQueueConfigValidation(t *testing.T) {
	for _, cfg := range []scheduling.QueueConfig{{Policy: 9}, {Capacity: -1}, {Threshold: -1}, {Threshold: math.Inf(1)}} {
		_, err := scheduling.NewQueue(cfg)
		require.ErrorIs(t, err, scheduling.ErrInvalidConfig)
	}
	for _, name := range []string{"fcfs", "lcfs", "wspt"} {
		p, err := scheduling.ParsePolicy(name)
		require.NoError(t, err)
		require.Equal(t, name, p.String())
	}
	_, err := scheduling.ParsePolicy("sjf")
	require.ErrorIs(t, err, scheduling.ErrInvalidConfig)
	require.Equal(t, "policy(7)", scheduling.Policy(7).String())
}

func TestQueueConcurrent(t *testing.T) {
	q := newQueue(t, scheduling.QueueConfig{Capacity: 10_000})
	var wg sync.WaitGroup
	const waiters = 400
	for i := range waiters {
		wg.Go(func() {
			ctx := context.Background()
			if i%4 == 0 {
				c, cancel := context.WithTimeout(ctx, time.Duration(i%13)*time.Millisecond)
				defer cancel()
				ctx = c
			}
			err := q.Wait(ctx, scheduling.Item{NewTokens: i, Priority: uint32(i % 3)}, i%5 != 0)
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				t.Error(err)
			}
		})
	}
	stop := make(chan struct{})
	var releaser sync.WaitGroup
	releaser.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				q.Release(1)
				time.Sleep(10 * time.Microsecond)
			}
		}
	})
	wg.Wait()
	close(stop)
	releaser.Wait()
	require.Zero(t, q.Len())
}
