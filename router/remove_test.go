package router_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/router"
)

// A removed worker leaves routing and the tracker at once; with
// RemoveGrace its blocks stay in the index (and its events go on being
// applied) until the grace passes, so that a worker added again within the
// grace is routed to with its cache known. PurgeWorker clears at once.
func TestRemoveGrace(t *testing.T) {
	const grace = time.Minute
	tests := []struct {
		name  string
		grace time.Duration
		// after runs after RemoveWorker(1) and the event applied meanwhile.
		after func(t *testing.T, r *router.Router, clock *clocktest.Clock, e1 *engine)
		// kept is whether the index ends with worker 1's blocks.
		kept bool
		// registered is whether worker 1 ends registered.
		registered bool
	}{
		{"no grace clears at once", 0, nil, false, false},
		{"added again within the grace", grace, func(t *testing.T, r *router.Router, c *clocktest.Clock, e1 *engine) {
			c.Advance(grace - time.Second)
			require.NoError(t, r.AddWorker(e1))
			c.Advance(2 * grace)
			r.CheckHealth() // the pending removal was cancelled
		}, true, true},
		{"grace passes", grace, func(t *testing.T, r *router.Router, c *clocktest.Clock, _ *engine) {
			c.Advance(grace - time.Second)
			r.CheckHealth()
			require.NotEmpty(t, r.Index().AppendWorkerBlocks(kvroute.WorkerKey{ID: 1}, nil), "cleared before the grace passed")
			c.Advance(time.Second)
			r.CheckHealth()
		}, false, false},
		{"added again after the grace, before housekeeping", grace, func(t *testing.T, r *router.Router, c *clocktest.Clock, e1 *engine) {
			c.Advance(grace)
			require.NoError(t, r.AddWorker(e1))
		}, false, true},
		{"purged during the grace", grace, func(t *testing.T, r *router.Router, _ *clocktest.Clock, _ *engine) {
			require.True(t, r.PurgeWorker(1))
			require.False(t, r.PurgeWorker(1))
		}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newClock()
			e1, e2 := newEngine(1), newEngine(2)
			r := newRouter(t, router.Config{Clock: clock, RemoveGrace: tt.grace}, e1, e2)
			w1 := kvroute.WorkerKey{ID: 1}
			ctx := context.Background()
			first, second := tokens(1, 8, 0, 0), tokens(2, 8, 0, 0)
			e1.serve(t, r, first)
			d, err := r.Select(ctx, &router.Request{Tokens: first})
			require.NoError(t, err)
			require.Equal(t, w1, d.Worker)
			require.Equal(t, 8, d.CachedBlocks)

			require.True(t, r.RemoveWorker(1))
			require.False(t, r.RemoveWorker(1))
			require.Zero(t, r.Tracker().Load(w1).ActiveRequests, "the removed worker's requests stay tracked")
			require.Equal(t, []kvroute.WorkerKey{{ID: 2}}, r.Workers())
			other, err := r.Select(ctx, &router.Request{Tokens: first})
			require.NoError(t, err)
			require.Equal(t, kvroute.WorkerKey{ID: 2}, other.Worker, "a removed worker was chosen")
			other.Done(router.Outcome{})
			d.Done(router.Outcome{}) // harmless after the removal
			if tt.grace == 0 {
				require.Empty(t, r.Index().AppendWorkerBlocks(w1, nil))
				return
			}
			e1.serve(t, r, second) // the engine's events go on meanwhile

			tt.after(t, r, clock, e1)
			held := r.Index().AppendWorkerBlocks(w1, nil)
			if !tt.kept {
				require.Empty(t, held)
			} else {
				require.Len(t, held, 16, "the blocks of both prompts")
			}
			_, ok := r.Health(w1)
			require.Equal(t, tt.registered, ok)
			if tt.registered {
				d, err := r.Select(ctx, &router.Request{Tokens: second})
				require.NoError(t, err)
				if tt.kept {
					require.Equal(t, w1, d.Worker)
					require.Equal(t, 8, d.CachedBlocks)
				} else {
					require.Zero(t, d.CachedBlocks)
				}
				d.Done(router.Outcome{})
			}
		})
	}
	_, err := router.New(router.Config{RemoveGrace: -time.Second})
	require.ErrorIs(t, err, router.ErrInvalidConfig)
}
