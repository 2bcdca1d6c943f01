package router_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// A worker removed and added again under the same id is a new incarnation:
// the late outcomes and lifecycle calls of decisions made for the old one
// neither count against its health nor change its load, while an update
// (UpdateWorker) keeps the incarnation and its decisions count.
func TestLateOutcomeOfAnEarlierIncarnation(t *testing.T) {
	w1 := kvroute.WorkerKey{ID: 1}
	failed := router.Outcome{Err: errors.New("502 bad gateway")}
	tests := []struct {
		name string
		cfg  router.Config
		// between runs after the old decisions were made, before their
		// outcomes arrive.
		between func(t *testing.T, r *router.Router)
		// outcome is the old decisions' outcome.
		outcome router.Outcome
		// before counts errors the worker has when the old outcomes arrive.
		before int
		want   router.Health
		// tracked is the worker's active requests once the current
		// incarnation's own request is under way.
		tracked int
	}{
		{"failures after a re-add", router.Config{}, readd, failed, 0, router.Healthy, 1},
		{"failures after a re-add within the grace", router.Config{RemoveGrace: time.Minute}, readd, failed, 0, router.Healthy, 1},
		{"successes after a re-add do not forgive the new errors", router.Config{}, readd, router.Outcome{}, 3, router.Degraded, 1},
		{"failures after an update count", router.Config{}, func(t *testing.T, r *router.Router) {
			require.NoError(t, r.UpdateWorker(router.StaticWorker{WorkerID: 1, Block: bs, Requests: 4}))
		}, failed, 0, router.Unhealthy, 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, tt.cfg, newEngine(1), newEngine(2))
			ctx := context.Background()
			pinned := &router.Request{Tokens: tokens(1, 4, 0, 0), Pin: w1, HasPin: true}
			var old []*router.Decision
			for range 5 {
				d, err := r.Select(ctx, pinned)
				require.NoError(t, err)
				old = append(old, d)
			}
			tt.between(t, r)
			for range tt.before {
				require.NoError(t, r.ReportError(w1, errors.New("refused")))
			}
			// The current incarnation's own request, under way meanwhile.
			cur, err := r.Select(ctx, &router.Request{Tokens: tokens(2, 4, 0, 0), Pin: w1, HasPin: true})
			require.NoError(t, err)
			load := r.Tracker().Load(w1)
			require.Equal(t, tt.tracked, load.ActiveRequests)
			for _, d := range old {
				d.PrefillDone()
				d.AddOutputTokens(1000)
				d.Done(tt.outcome)
			}
			h, ok := r.Health(w1)
			require.True(t, ok)
			require.Equal(t, tt.want, h)
			if tt.tracked == 1 {
				require.Equal(t, load, r.Tracker().Load(w1), "the old decisions changed the new incarnation's load")
			}
			cur.Done(router.Outcome{})
			require.Zero(t, r.Tracker().Load(w1).ActiveRequests)
		})
	}
}

// readd removes worker 1 and adds it again.
func readd(t *testing.T, r *router.Router) {
	t.Helper()
	require.True(t, r.RemoveWorker(1))
	require.NoError(t, r.AddWorker(newEngine(1)))
}

// A worker removed and added again while a decision is being made for it
// (between the choice and the tracking of its load) is not left with the
// decision's load: that request was routed to the old incarnation.
func TestWorkerReplacedDuringSelect(t *testing.T) {
	tests := []struct {
		name  string
		grace time.Duration
		readd bool
	}{
		{"removed", 0, false},
		{"removed and added again", 0, true},
		{"removed and added again within the grace", time.Minute, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r *router.Router
			replaced := false
			cost := scheduling.CostFuncFunc(func(_ *scheduling.Request, cands []scheduling.Candidate, costs []float64) {
				for i := range cands {
					costs[i] = float64(cands[i].Worker.ID)
				}
				if !replaced {
					replaced = true
					require.True(t, r.RemoveWorker(1))
					if tt.readd {
						require.NoError(t, r.AddWorker(newEngine(1)))
					}
				}
			})
			ls := &countingSync{added: map[scheduling.RequestID]int{}, freed: map[scheduling.RequestID]int{}}
			// The tracker is shared with another router replica, whose
			// request ids are its own: one may be any number.
			shared, err := scheduling.NewTracker(scheduling.TrackerConfig{BlockSize: bs})
			require.NoError(t, err)
			w1, w2 := kvroute.WorkerKey{ID: 1}, kvroute.WorkerKey{ID: 2}
			require.NoError(t, shared.Add(0, w2, nil, 100))
			peer := shared.Load(w2)
			r = newRouter(t, router.Config{Cost: cost, RemoveGrace: tt.grace, LoadSync: ls, LoadTracker: shared},
				newEngine(1), newEngine(2))
			d, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 4, 0, 0)})
			require.NoError(t, err)
			require.Equal(t, w1, d.Worker, "chosen from the snapshot the decision started on")
			require.Zero(t, r.Tracker().Load(w1).ActiveRequests, "the replaced worker's id carries the decision's load")
			require.Equal(t, 1, r.Stats().TrackedRequests, "the peer's request alone")
			d.AddOutputTokens(100)
			d.PrefillDone()
			for range 5 {
				d.Done(router.Outcome{Err: errors.New("connection refused")})
			}
			require.Equal(t, peer, shared.Load(w2), "the decision changed a peer's request")
			if h, ok := r.Health(w1); tt.readd {
				require.True(t, ok)
				require.Equal(t, router.Healthy, h)
			} else {
				require.False(t, ok)
			}
			require.Len(t, ls.added, 1)
			require.Equal(t, ls.added, ls.freed, "the load sync was not told once that the request ended")
		})
	}
}

// Decisions made while their worker is removed and added again over and
// over leave nothing behind once each has ended: no load on any worker,
// and the load sync told once of the start and once of the end of each
// request it was told of.
func TestSelectDuringWorkerChurn(t *testing.T) {
	ls := &countingSync{added: map[scheduling.RequestID]int{}, freed: map[scheduling.RequestID]int{}}
	r := newRouter(t, router.Config{LoadSync: ls}, newEngine(1), newEngine(2))
	ctx := context.Background()
	stop := make(chan struct{})
	var churn, selects sync.WaitGroup
	churn.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			r.RemoveWorker(1)
			require.NoError(t, r.AddWorker(newEngine(1)))
		}
	})
	for g := range 4 {
		selects.Go(func() {
			for i := range 2000 {
				d, err := r.Select(ctx, &router.Request{Tokens: tokens(g, 2, i, 1)})
				require.NoError(t, err) // worker 2 stays
				if i%2 == 0 {
					d.PrefillDone()
				}
				d.AddOutputTokens(20)
				d.Done(router.Outcome{})
			}
		})
	}
	selects.Wait()
	close(stop)
	churn.Wait()
	for _, w := range []kvroute.WorkerKey{{ID: 1}, {ID: 2}} {
		require.Zero(t, r.Tracker().Load(w), "worker %s", w)
	}
	require.Zero(t, r.Stats().TrackedRequests)
	require.NotEmpty(t, ls.added)
	for id, n := range ls.added {
		require.Equal(t, 1, n)
		require.Equal(t, 1, ls.freed[id], "request %d", id)
	}
	require.Len(t, ls.freed, len(ls.added))
}
