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
	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

const bs = 16

var hasher = kvroute.MustHasher(kvroute.HasherConfig{BlockSize: bs})

func newClock() *clocktest.Clock { return clocktest.New(time.Unix(1_000_000, 0)) }

// engine is an in-process fake engine: it implements router.Worker and,
// when it serves a prompt, caches its blocks and publishes the KV events an
// engine would to the router's index.
type engine struct {
	id     kvroute.WorkerID
	role   router.Role
	ranks  int
	nextID uint64
	held   map[kvroute.SeqHash]bool
}

func newEngine(id kvroute.WorkerID) *engine {
	return &engine{id: id, held: map[kvroute.SeqHash]bool{}}
}

func (e *engine) ID() kvroute.WorkerID   { return e.id }
func (e *engine) DataParallelRanks() int { return max(e.ranks, 1) }
func (e *engine) BlockSize() int         { return bs }
func (e *engine) Role() router.Role      { return e.role }

// serve caches tokens' full blocks (rank 0) and publishes a Stored event
// for the new ones. It returns how many prompt tokens were cached before.
func (e *engine) serve(t testing.TB, r *router.Router, tokens []uint32) int {
	t.Helper()
	blocks, seqs := hasher.AppendHashes(nil, nil, tokens)
	cached := 0
	for cached < len(seqs) && e.held[seqs[cached]] {
		cached++
	}
	if cached < len(seqs) {
		e.nextID++
		ev := &kvroute.Event{Kind: kvroute.EventStored, Worker: kvroute.WorkerKey{ID: e.id}, ID: e.nextID}
		if cached > 0 {
			ev.HasParent, ev.Parent = true, kvroute.ExternalHash(seqs[cached-1])
		}
		for i := cached; i < len(seqs); i++ {
			ev.Blocks = append(ev.Blocks, kvroute.StoredBlock{External: kvroute.ExternalHash(seqs[i]), Hash: blocks[i]})
			e.held[seqs[i]] = true
		}
		require.NoError(t, r.Index().Apply(ev))
	}
	return cached * bs
}

// tokens returns a prompt: the system prompt sys (n blocks) then a user
// part unique to user (m blocks).
func tokens(sys, n, user, m int) []uint32 {
	var out []uint32
	for i := range n * bs {
		out = append(out, uint32(sys*100_000+i))
	}
	for i := range m * bs {
		out = append(out, uint32(7_000_000+user*1000+i))
	}
	return out
}

func newRouter(t testing.TB, cfg router.Config, engines ...*engine) *router.Router {
	t.Helper()
	cfg.Hasher = hasher
	if cfg.Selector.Seed == 0 {
		cfg.Selector.Seed = 1
	}
	r, err := router.New(cfg)
	require.NoError(t, err)
	for _, e := range engines {
		require.NoError(t, r.AddWorker(e))
	}
	return r
}

func TestSharedPrefixLandsOnHolder(t *testing.T) {
	es := []*engine{newEngine(1), newEngine(2), newEngine(3), newEngine(4)}
	r := newRouter(t, router.Config{}, es...)
	ctx := context.Background()
	// Worker 3 served the system prompt before.
	es[2].serve(t, r, tokens(1, 32, 0, 2))

	d, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 32, 1, 4)})
	require.NoError(t, err)
	require.Equal(t, kvroute.WorkerKey{ID: 3}, d.Worker)
	require.Equal(t, 32, d.CachedBlocks)
	require.Equal(t, 32*bs, d.CachedTokens)
	require.Equal(t, 36, d.Blocks)
	d.PrefillDone()
	d.Done(router.Outcome{CachedTokens: es[2].serve(t, r, tokens(1, 32, 1, 4)), CachedTokensKnown: true})

	st := r.Stats()
	require.EqualValues(t, 1, st.Decisions)
	require.EqualValues(t, 32*bs, st.ActualCachedTokens)
	require.Equal(t, 1.0, st.Accuracy)
	require.Equal(t, 1, st.AccuracySamples)
	require.Equal(t, 5*time.Second, st.RecommendedSyncInterval)
	require.Zero(t, st.TrackedRequests)
}

func TestHotPrefixSpreadsWhenBusy(t *testing.T) {
	es := []*engine{newEngine(1), newEngine(2), newEngine(3), newEngine(4)}
	r := newRouter(t, router.Config{}, es...)
	ctx := context.Background()
	es[0].serve(t, r, tokens(1, 32, 0, 0))

	counts := map[kvroute.WorkerKey]int{}
	var open []*router.Decision
	for u := range 40 {
		d, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 32, u+1, 8)})
		require.NoError(t, err)
		counts[d.Worker]++
		open = append(open, d)
	}
	// The holder takes the first requests, then its queue of uncached
	// suffixes costs more than recomputing the prefix elsewhere.
	require.Greater(t, counts[kvroute.WorkerKey{ID: 1}], 3)
	require.Less(t, counts[kvroute.WorkerKey{ID: 1}], 30)
	require.Greater(t, len(counts), 1)
	for _, d := range open {
		d.Done(router.Outcome{})
	}
	require.Zero(t, r.Stats().TrackedRequests)
}

func TestBusyThresholdsAndAllBusy(t *testing.T) {
	es := []*engine{newEngine(1), newEngine(2)}
	r := newRouter(t, router.Config{Busy: scheduling.BusyThresholds{MaxPrefillTokens: 600}}, es...)
	ctx := context.Background()
	var open []*router.Decision
	for u := range 4 {
		d, err := r.Select(ctx, &router.Request{Tokens: tokens(9, 0, u, 40)}) // 640 uncached tokens each: over 600 once chosen
		if u < 2 {
			require.NoError(t, err)
			open = append(open, d)
			continue
		}
		require.ErrorIs(t, err, scheduling.ErrAllBusy)
		var busy *scheduling.AllBusyError
		require.True(t, errors.As(err, &busy))
	}
	require.NotEqual(t, open[0].Worker, open[1].Worker)
	open[0].PrefillDone() // its prefill tokens no longer count
	d, err := r.Select(ctx, &router.Request{Tokens: tokens(9, 0, 99, 40)})
	require.NoError(t, err)
	require.Equal(t, open[0].Worker, d.Worker)
	require.EqualValues(t, 2, r.Stats().Rejected)
}

func TestDeadWorkerStopsBeingChosen(t *testing.T) {
	clock := newClock()
	es := []*engine{newEngine(1), newEngine(2)}
	r := newRouter(t, router.Config{Clock: clock}, es...)
	ctx := context.Background()
	prompt := tokens(1, 16, 0, 1)
	es[0].serve(t, r, prompt)

	pick := func() kvroute.WorkerKey {
		d, err := r.Select(ctx, &router.Request{Tokens: prompt})
		require.NoError(t, err)
		d.Done(router.Outcome{})
		return d.Worker
	}
	w1, w2 := kvroute.WorkerKey{ID: 1}, kvroute.WorkerKey{ID: 2}
	require.Equal(t, w1, pick())

	// Heartbeats stop: degraded after 5 s, unhealthy after 15 s.
	require.NoError(t, r.Heartbeat(w1, scheduling.Load{}))
	require.NoError(t, r.Heartbeat(w2, scheduling.Load{}))
	clock.Advance(6 * time.Second)
	require.NoError(t, r.Heartbeat(w2, scheduling.Load{}))
	r.CheckHealth()
	h, _ := r.Health(w1)
	require.Equal(t, router.Degraded, h)
	require.Equal(t, w2, pick(), "a healthy worker goes before a degraded one")

	clock.Advance(10 * time.Second)
	require.NoError(t, r.Heartbeat(w2, scheduling.Load{}))
	r.CheckHealth()
	h, _ = r.Health(w1)
	require.Equal(t, router.Unhealthy, h)
	require.Equal(t, w2, pick())

	// The heartbeat comes back.
	require.NoError(t, r.Heartbeat(w1, scheduling.Load{}))
	require.Equal(t, w1, pick())

	// Errors make it unhealthy too; a success resets them.
	for range 5 {
		require.NoError(t, r.ReportError(w1, errors.New("connection refused")))
	}
	require.Equal(t, w2, pick())
	require.NoError(t, r.Heartbeat(w1, scheduling.Load{}))

	// Removal drops its blocks from the index.
	require.True(t, r.RemoveWorker(1))
	require.False(t, r.RemoveWorker(1))
	require.Empty(t, r.Index().AppendWorkerBlocks(w1, nil))
	require.Equal(t, w2, pick())
	require.ErrorIs(t, r.Heartbeat(w1, scheduling.Load{}), router.ErrUnknownWorker)

	require.True(t, r.RemoveWorker(2))
	_, err := r.Select(ctx, &router.Request{Tokens: prompt})
	require.ErrorIs(t, err, router.ErrNoWorkers)
}

func TestFailedOutcomesDegradeWorker(t *testing.T) {
	es := []*engine{newEngine(1), newEngine(2)}
	r := newRouter(t, router.Config{}, es...)
	ctx := context.Background()
	w1 := kvroute.WorkerKey{ID: 1}
	es[0].serve(t, r, tokens(1, 16, 0, 0))
	for range 3 {
		d, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 16, 0, 0), Pin: w1, HasPin: true})
		require.NoError(t, err)
		d.Done(router.Outcome{Err: errors.New("500 internal error")})
	}
	h, _ := r.Health(w1)
	require.Equal(t, router.Degraded, h)
	// A cancellation is not the worker's fault.
	d, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 16, 0, 0), Pin: w1, HasPin: true})
	require.NoError(t, err)
	d.Done(router.Outcome{Err: context.Canceled})
	h, _ = r.Health(w1)
	require.Equal(t, router.Degraded, h)
	require.EqualValues(t, 3, r.Stats().Failures)
}

func TestConcurrentSelectIsRaceFree(t *testing.T) {
	es := []*engine{newEngine(1), newEngine(2), newEngine(3), newEngine(4)}
	r := newRouter(t, router.Config{}, es...)
	for i, e := range es {
		e.serve(t, r, tokens(i, 8, 0, 0))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	// Workers come and go while requests are routed.
	wg.Add(1)
	go func() {
		defer wg.Done()
		extra := newEngine(99)
		for i := 0; ctx.Err() == nil && i < 200; i++ {
			_ = r.AddWorker(extra)
			_ = r.Heartbeat(kvroute.WorkerKey{ID: 99}, scheduling.Load{QueueDepth: i % 3})
			r.CheckHealth()
			r.RemoveWorker(99)
		}
	}()
	const goroutines, perG = 8, 200
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d router.Decision
			for i := range perG {
				req := &router.Request{Tokens: tokens(i%4, 8, g*perG+i, 2), Explain: i%50 == 0}
				if err := r.SelectInto(ctx, req, &d); err != nil {
					t.Error(err)
					return
				}
				d.PrefillDone()
				d.AddOutputTokens(17)
				d.Done(router.Outcome{CachedTokens: 8 * bs, CachedTokensKnown: true})
				_ = r.Stats()
			}
		}()
	}
	wg.Wait()
	st := r.Stats()
	require.EqualValues(t, goroutines*perG, st.Decisions)
	require.Zero(t, st.TrackedRequests)
	require.EqualValues(t, goroutines*perG, st.SelectLatency.Count)
}

func TestDecisionLifecycleIsIdempotent(t *testing.T) {
	r := newRouter(t, router.Config{}, newEngine(1))
	d, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 4, 0, 0)})
	require.NoError(t, err)
	require.Equal(t, 1, r.Tracker().Load(d.Worker).ActiveRequests)
	d.PrefillDone()
	d.PrefillDone()
	d.Done(router.Outcome{})
	d.Done(router.Outcome{Err: errors.New("late")})
	d.PrefillDone()
	d.AddOutputTokens(10)
	require.Zero(t, r.Tracker().Load(d.Worker).ActiveRequests)
	require.EqualValues(t, 1, r.Stats().Outcomes)
	require.Zero(t, r.Stats().Failures)

	var nilDecision *router.Decision
	nilDecision.PrefillDone()
	nilDecision.Done(router.Outcome{})
	(&router.Decision{}).Done(router.Outcome{})
}

func TestForgottenDoneExpires(t *testing.T) {
	clock := newClock()
	r := newRouter(t, router.Config{Clock: clock, Tracker: scheduling.TrackerConfig{TTL: time.Minute}}, newEngine(1))
	_, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 4, 0, 0)})
	require.NoError(t, err)
	require.Equal(t, 1, r.Stats().TrackedRequests)
	clock.Advance(2 * time.Minute)
	r.CheckHealth() // the host's periodic housekeeping expires it
	require.Zero(t, r.Stats().TrackedRequests)
}

func TestPinAndSessionAffinity(t *testing.T) {
	clock := newClock()
	es := []*engine{newEngine(1), newEngine(2), newEngine(3)}
	r := newRouter(t, router.Config{Clock: clock, SessionTTL: time.Minute}, es...)
	ctx := context.Background()
	es[0].serve(t, r, tokens(1, 16, 0, 0))

	d, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 16, 0, 0), Pin: kvroute.WorkerKey{ID: 3}, HasPin: true})
	require.NoError(t, err)
	require.Equal(t, kvroute.WorkerKey{ID: 3}, d.Worker)
	d.Done(router.Outcome{})
	_, err = r.Select(ctx, &router.Request{Tokens: tokens(1, 16, 0, 0), Pin: kvroute.WorkerKey{ID: 7}, HasPin: true})
	require.ErrorIs(t, err, router.ErrPinnedUnavailable)

	// The session starts on worker 2 (pinned) and sticks to it unpinned,
	// although worker 1 holds the prefix.
	d, err = r.Select(ctx, &router.Request{Tokens: tokens(1, 16, 0, 0), SessionKey: "s1", Pin: kvroute.WorkerKey{ID: 2}, HasPin: true})
	require.NoError(t, err)
	d.Done(router.Outcome{})
	for range 3 {
		d, err = r.Select(ctx, &router.Request{Tokens: tokens(1, 16, 0, 0), SessionKey: "s1"})
		require.NoError(t, err)
		require.Equal(t, kvroute.WorkerKey{ID: 2}, d.Worker)
		d.Done(router.Outcome{})
	}
	// Excluded workers are never chosen, even for their session.
	d, err = r.Select(ctx, &router.Request{Tokens: tokens(1, 16, 0, 0), SessionKey: "s1",
		Exclude: []kvroute.WorkerKey{{ID: 2}, {ID: 1}}})
	require.NoError(t, err)
	require.Equal(t, kvroute.WorkerKey{ID: 3}, d.Worker)
	d.Done(router.Outcome{})
	_, err = r.Select(ctx, &router.Request{Tokens: tokens(1, 16, 0, 0),
		Exclude: []kvroute.WorkerKey{{ID: 1}, {ID: 2}, {ID: 3}}})
	require.ErrorIs(t, err, router.ErrNoWorkers)
	require.False(t, r.Approximate())

	// After the TTL the session is forgotten and the cache wins again.
	clock.Advance(2 * time.Minute)
	d, err = r.Select(ctx, &router.Request{Tokens: tokens(1, 16, 0, 0), SessionKey: "s1"})
	require.NoError(t, err)
	require.Equal(t, kvroute.WorkerKey{ID: 1}, d.Worker)
}

func TestDisaggregation(t *testing.T) {
	p1, p2 := newEngine(1), newEngine(2)
	p1.role, p2.role = router.RolePrefill, router.RolePrefill
	d1, d2 := newEngine(11), newEngine(12)
	d1.role, d2.role = router.RoleDecode, router.RoleDecode
	r := newRouter(t, router.Config{}, p1, p2, d1, d2)
	ctx := context.Background()
	prompt := tokens(1, 20, 0, 4)
	p2.serve(t, r, tokens(1, 20, 0, 0)) // prefill worker 2 holds the system prompt
	d2.serve(t, r, tokens(1, 8, 0, 0))  // decode worker 12 holds a bit of it

	// Make decode worker 12 the less loaded one.
	busy, err := r.Select(ctx, &router.Request{Tokens: tokens(5, 0, 1, 30), Pin: kvroute.WorkerKey{ID: 11}, HasPin: true})
	require.NoError(t, err)
	require.Equal(t, kvroute.WorkerKey{ID: 11}, busy.Worker)
	require.True(t, busy.Disaggregated, "the pin binds the decode phase; prefill is chosen freely")
	busy.PrefillDone() // its prefill is over; its decode load stays on 11

	d, err := r.Select(ctx, &router.Request{Tokens: prompt, Explain: true})
	require.NoError(t, err)
	require.True(t, d.Disaggregated)
	require.Equal(t, kvroute.WorkerKey{ID: 2}, d.Prefill)
	require.Equal(t, kvroute.WorkerKey{ID: 12}, d.Worker)
	require.Equal(t, 20, d.CachedBlocks)
	require.Equal(t, router.Transfer{From: d.Prefill, To: d.Worker, FirstBlock: 8, Blocks: 16}, d.Transfer)
	require.NotEmpty(t, d.Candidates)
	require.Equal(t, 1, r.Tracker().Load(d.Prefill).ActiveRequests)
	d.PrefillDone()
	require.Zero(t, r.Tracker().Load(d.Prefill).ActiveRequests, "the prefill worker is done at the first token")
	require.Equal(t, 1, r.Tracker().Load(d.Worker).ActiveRequests)
	d.Done(router.Outcome{})
	busy.Done(router.Outcome{})
	require.EqualValues(t, 2, r.Stats().Disaggregated)

	// Without healthy prefill workers, decode workers prefill themselves.
	for range 5 {
		require.NoError(t, r.ReportError(kvroute.WorkerKey{ID: 1}, errors.New("down")))
		require.NoError(t, r.ReportError(kvroute.WorkerKey{ID: 2}, errors.New("down")))
	}
	d, err = r.Select(ctx, &router.Request{Tokens: prompt})
	require.NoError(t, err)
	require.False(t, d.Disaggregated)
	require.Equal(t, kvroute.WorkerKey{ID: 12}, d.Worker)
}

func TestApproximateMode(t *testing.T) {
	clock := newClock()
	r := newRouter(t, router.Config{Approximate: true, Clock: clock}, newEngine(1), newEngine(2), newEngine(3))
	ctx := context.Background()
	first, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 24, 0, 1)})
	require.NoError(t, err)
	require.Zero(t, first.CachedBlocks)
	first.Done(router.Outcome{})
	second, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 24, 1, 1)})
	require.NoError(t, err)
	require.Equal(t, first.Worker, second.Worker, "the router remembers where it sent the prefix")
	require.Equal(t, 24, second.CachedBlocks)
	second.Done(router.Outcome{})
	// After the TTL (120 s) the prediction is gone.
	clock.Advance(3 * time.Minute)
	third, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 24, 2, 1)})
	require.NoError(t, err)
	require.Zero(t, third.CachedBlocks)
}

func TestFeedbackAccuracy(t *testing.T) {
	tests := []struct {
		hits, misses int
		want         time.Duration
	}{
		{hits: 10, misses: 0, want: 5 * time.Second},
		{hits: 9, misses: 1, want: 2 * time.Second},
		{hits: 8, misses: 2, want: time.Second},
		{hits: 1, misses: 1, want: 500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d/%d", tt.hits, tt.misses), func(t *testing.T) {
			e := newEngine(1)
			r := newRouter(t, router.Config{}, e)
			e.serve(t, r, tokens(1, 10, 0, 0))
			for i := range tt.hits + tt.misses {
				d, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 10, 0, 0)})
				require.NoError(t, err)
				require.Equal(t, 160, d.CachedTokens)
				actual := 128 // 80% of the prediction: a hit
				if i >= tt.hits {
					actual = 127
				}
				d.Done(router.Outcome{CachedTokens: actual, CachedTokensKnown: true})
			}
			st := r.Stats()
			require.InDelta(t, float64(tt.hits)/float64(tt.hits+tt.misses), st.Accuracy, 1e-9)
			require.Equal(t, tt.want, st.RecommendedSyncInterval)
		})
	}
}

func TestAdmissionQueue(t *testing.T) {
	w := router.StaticWorker{WorkerID: 1, Block: bs, BatchedTokens: 512}
	r, err := router.New(router.Config{Hasher: hasher, Queue: &scheduling.QueueConfig{Policy: scheduling.FCFS}})
	require.NoError(t, err)
	require.NoError(t, r.AddWorker(w))
	ctx := context.Background()
	first, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 0, 1, 40)}) // 640 tokens > 512: saturated
	require.NoError(t, err)

	got := make(chan *router.Decision)
	go func() {
		d, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 0, 2, 4)})
		if err != nil {
			t.Error(err)
		}
		got <- d
	}()
	require.Eventually(t, func() bool { return r.Stats().QueueDepth == 1 }, 5*time.Second, time.Millisecond)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = r.Select(cctx, &router.Request{Tokens: tokens(1, 0, 3, 4)})
	require.ErrorIs(t, err, context.Canceled)

	first.PrefillDone() // load drops: the waiting request is admitted
	d := <-got
	require.NotNil(t, d)
	require.Positive(t, d.Waited)
	d.Done(router.Outcome{})
	first.Done(router.Outcome{})
}

// A request that already runs on a worker (Admitted) is tracked there
// past the busy thresholds and without waiting in the admission queue.
func TestAdmittedPin(t *testing.T) {
	w2 := kvroute.WorkerKey{ID: 2}
	tests := []struct {
		name string
		cfg  router.Config
	}{
		{name: "admission queue", cfg: router.Config{Queue: &scheduling.QueueConfig{Policy: scheduling.FCFS}}},
		{name: "busy thresholds", cfg: router.Config{Busy: scheduling.BusyThresholds{MaxPrefillTokens: 512}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Hasher = hasher
			r, err := router.New(tt.cfg)
			require.NoError(t, err)
			for _, id := range []kvroute.WorkerID{1, 2} {
				require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: id, Block: bs, BatchedTokens: 512}))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			// 640 tokens to prefill on worker 2: saturated, and busy.
			busy, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 0, 1, 40), Pin: w2, HasPin: true})
			require.NoError(t, err)
			defer busy.Done(router.Outcome{})
			quick, qcancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer qcancel()
			_, err = r.Select(quick, &router.Request{Tokens: tokens(1, 0, 2, 4), Pin: w2, HasPin: true})
			require.Error(t, err, "a new request pinned to the busy worker is held or refused")

			d, err := r.Select(ctx, &router.Request{Tokens: tokens(1, 0, 3, 4), Pin: w2, HasPin: true, Admitted: true})
			require.NoError(t, err)
			require.Equal(t, w2, d.Worker)
			require.Zero(t, d.Waited)
			require.Equal(t, 2, r.Tracker().Load(w2).ActiveRequests)
			d.Done(router.Outcome{})
			require.Equal(t, 1, r.Tracker().Load(w2).ActiveRequests)

			_, err = r.Select(ctx, &router.Request{Tokens: tokens(1, 0, 3, 4), Pin: kvroute.WorkerKey{ID: 9}, HasPin: true, Admitted: true})
			require.ErrorIs(t, err, router.ErrPinnedUnavailable, "a worker the router does not know")
		})
	}
}

func TestConfigValidation(t *testing.T) {
	_, err := router.New(router.Config{Health: router.HealthConfig{DegradedAfter: time.Minute, UnhealthyAfter: time.Second}})
	require.ErrorIs(t, err, router.ErrInvalidConfig)
	_, err = router.New(router.Config{Busy: scheduling.BusyThresholds{PrefillTokens: -1}})
	require.ErrorIs(t, err, router.ErrInvalidConfig)
	// A shared load tracker counts blocks of the hasher's size.
	tracker32, err := scheduling.NewTracker(scheduling.TrackerConfig{BlockSize: 32})
	require.NoError(t, err)
	_, err = router.New(router.Config{LoadTracker: tracker32})
	require.ErrorIs(t, err, router.ErrInvalidConfig, "a tracker of 32-token blocks beside 16-token hashing")
	_, err = router.New(router.Config{LoadTracker: tracker32, Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 32})})
	require.NoError(t, err)
	r := newRouter(t, router.Config{})
	require.ErrorIs(t, r.AddWorker(router.StaticWorker{WorkerID: 1, Block: 64}), router.ErrInvalidConfig)
	require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 1, Block: bs}))
	require.ErrorIs(t, r.AddWorker(router.StaticWorker{WorkerID: 1, Block: bs}), router.ErrDuplicateWorker)
	require.ErrorIs(t, r.UpdateWorker(router.StaticWorker{WorkerID: 2}), router.ErrUnknownWorker)
	require.NoError(t, r.UpdateWorker(router.StaticWorker{WorkerID: 1, Block: bs, Ranks: 4}))
	require.Len(t, r.Workers(), 4)
	require.NoError(t, r.UpdateWorker(router.StaticWorker{WorkerID: 1, Block: bs, Ranks: 2}))
	require.Equal(t, []kvroute.WorkerKey{{ID: 1}, {ID: 1, Rank: 1}}, r.Workers())
}

func TestSelectIntoAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector (sync.Pool drops items)")
	}
	es := []*engine{newEngine(1), newEngine(2), newEngine(3), newEngine(4)}
	r := newRouter(t, router.Config{}, es...)
	for i, e := range es {
		e.serve(t, r, tokens(i, 64, 0, 0))
	}
	req := &router.Request{Tokens: tokens(2, 64, 0, 0)}
	var d router.Decision
	ctx := context.Background()
	for range 10 {
		require.NoError(t, r.SelectInto(ctx, req, &d))
		d.Done(router.Outcome{})
	}
	allocs := testing.AllocsPerRun(200, func() {
		if err := r.SelectInto(ctx, req, &d); err != nil {
			t.Fatal(err)
		}
		d.Done(router.Outcome{})
	})
	require.Zero(t, allocs)
}

func TestStalenessCostSeesLastEvent(t *testing.T) {
	clock := newClock()
	inner, err := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{})
	require.NoError(t, err)
	cost, err := scheduling.NewStalenessCost(inner, scheduling.StalenessConfig{Interval: time.Second, Clock: clock})
	require.NoError(t, err)
	es := []*engine{newEngine(1), newEngine(2)}
	r := newRouter(t, router.Config{Clock: clock, Cost: cost}, es...)
	ctx := context.Background()
	prompt := tokens(1, 16, 0, 2)
	es[0].serve(t, r, prompt)
	es[1].serve(t, r, tokens(1, 12, 0, 0))

	d, err := r.Select(ctx, &router.Request{Tokens: prompt})
	require.NoError(t, err)
	require.Equal(t, kvroute.WorkerKey{ID: 1}, d.Worker, "fresh index: the deeper prefix wins")
	d.Done(router.Outcome{})

	// Worker 1's events stop while worker 2 keeps publishing: worker 1's
	// overlap is no longer trusted.
	clock.Advance(3 * time.Second)
	es[1].serve(t, r, tokens(7, 1, 0, 0))
	d, err = r.Select(ctx, &router.Request{Tokens: prompt})
	require.NoError(t, err)
	require.Equal(t, kvroute.WorkerKey{ID: 2}, d.Worker)
	d.Done(router.Outcome{})
}

func TestPinToPrefillWorker(t *testing.T) {
	p1 := newEngine(1)
	p1.role = router.RolePrefill
	p2 := newEngine(2)
	p2.role = router.RolePrefill
	d11 := newEngine(11)
	d11.role = router.RoleDecode
	r := newRouter(t, router.Config{}, p1, p2, d11)
	d, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 4, 0, 0), Pin: kvroute.WorkerKey{ID: 2}, HasPin: true})
	require.NoError(t, err)
	require.True(t, d.Disaggregated)
	require.Equal(t, kvroute.WorkerKey{ID: 2}, d.Prefill)
	require.Equal(t, kvroute.WorkerKey{ID: 11}, d.Worker)
	d.Done(router.Outcome{})
}

func TestErrorsAreForgivenAndSuccessRestoresHealth(t *testing.T) {
	clock := newClock()
	r := newRouter(t, router.Config{Clock: clock}, newEngine(1), newEngine(2))
	w1 := kvroute.WorkerKey{ID: 1}
	for range 3 {
		require.NoError(t, r.ReportError(w1, errors.New("timeout")))
	}
	h, _ := r.Health(w1)
	require.Equal(t, router.Degraded, h)
	// A success through a pinned request restores it at once.
	d, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 4, 0, 0), Pin: w1, HasPin: true})
	require.NoError(t, err)
	d.Done(router.Outcome{})
	h, _ = r.Health(w1)
	require.Equal(t, router.Healthy, h)

	// Without successes or heartbeats, errors are forgiven after
	// UnhealthyAfter (15 s by default).
	for range 5 {
		require.NoError(t, r.ReportError(w1, errors.New("timeout")))
	}
	h, _ = r.Health(w1)
	require.Equal(t, router.Unhealthy, h)
	clock.Advance(16 * time.Second)
	r.CheckHealth()
	h, _ = r.Health(w1)
	require.Equal(t, router.Healthy, h)
}

func TestQueueWakesOnLoadReports(t *testing.T) {
	w := router.StaticWorker{WorkerID: 1, Block: bs, BatchedTokens: 512}
	r, err := router.New(router.Config{Hasher: hasher, Queue: &scheduling.QueueConfig{}, LoadReports: router.LoadReportMerged})
	require.NoError(t, err)
	require.NoError(t, r.AddWorker(w))
	key := kvroute.WorkerKey{ID: 1}
	// Another router's traffic saturates the engine.
	require.NoError(t, r.Heartbeat(key, scheduling.Load{ActivePrefillTokens: 10_000}))
	got := make(chan error, 1)
	go func() {
		d, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 0, 1, 4)})
		if err == nil {
			d.Done(router.Outcome{})
		}
		got <- err
	}()
	require.Eventually(t, func() bool { return r.Stats().QueueDepth == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, r.Heartbeat(key, scheduling.Load{})) // the engine drained
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting request was not admitted after the load report")
	}
}

func TestFailedSelectLeavesNothingToBalance(t *testing.T) {
	r := newRouter(t, router.Config{})
	var d router.Decision
	require.ErrorIs(t, r.SelectInto(context.Background(), &router.Request{Tokens: tokens(1, 4, 0, 0)}, &d), router.ErrNoWorkers)
	d.Done(router.Outcome{Err: errors.New("x")})
	require.Zero(t, r.Stats().Outcomes)
	require.ErrorIs(t, r.AddWorker(router.StaticWorker{WorkerID: 5, Ranks: router.MaxDataParallelRanks + 1}), router.ErrInvalidConfig)
}

// A worker that reports its KV capacity has room made for each of its
// ranks' caches in the index, when added and when updated; one that
// reports none leaves the index's default.
func TestWorkerCapacityReservesIndexRoom(t *testing.T) {
	r, err := router.New(router.Config{Hasher: hasher})
	require.NoError(t, err)
	require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 1, Ranks: 2, CapacityBlocks: 800}))
	require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 2}))
	ix := r.Index()
	for rank := range kvroute.DPRank(2) {
		require.Equal(t, 800, ix.Reservation(kvroute.WorkerKey{ID: 1, Rank: rank}))
	}
	require.Zero(t, ix.Reservation(kvroute.WorkerKey{ID: 2}))

	require.NoError(t, r.UpdateWorker(router.StaticWorker{WorkerID: 1, Ranks: 2, CapacityBlocks: 2000}))
	require.Equal(t, 2000, ix.Reservation(kvroute.WorkerKey{ID: 1, Rank: 1}))

	// A worker that no longer reports its capacity loses the room the
	// router made; room the host made for one that never reported stays.
	ix.ReserveWorker(kvroute.WorkerKey{ID: 2}, 300)
	require.NoError(t, r.UpdateWorker(router.StaticWorker{WorkerID: 2}))
	require.Equal(t, 300, ix.Reservation(kvroute.WorkerKey{ID: 2}))
	require.NoError(t, r.UpdateWorker(router.StaticWorker{WorkerID: 1, Ranks: 2}))
	for rank := range kvroute.DPRank(2) {
		require.Zero(t, ix.Reservation(kvroute.WorkerKey{ID: 1, Rank: rank}))
	}
	require.NoError(t, r.UpdateWorker(router.StaticWorker{WorkerID: 1, Ranks: 2, CapacityBlocks: 2000}))
	require.True(t, r.RemoveWorker(1))
	require.Zero(t, ix.Reservation(kvroute.WorkerKey{ID: 1}), "the worker's blocks and room leave the index")
}
