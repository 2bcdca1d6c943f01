package router_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// hookHandler is a slog handler that calls hook with every record, so that
// a test can act at the moment the router logs.
type hookHandler struct {
	hook func(slog.Record)
}

func (h hookHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h hookHandler) Handle(_ context.Context, rec slog.Record) error {
	h.hook(rec)
	return nil
}
func (h hookHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h hookHandler) WithGroup(string) slog.Handler      { return h }

// recordAttr returns the value of a record's attribute, "" when it has
// none of that key.
func recordAttr(rec slog.Record, key string) string {
	var v string
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// Two judgements of one worker's health that overlap leave the health the
// later one found, not the earlier one's: here a CheckHealth runs while
// another, which started before the clock moved on, is between two
// workers. The earlier one must not put back the state of its own time.
func TestOverlappingHealthChecksKeepTheLaterJudgement(t *testing.T) {
	clock := newClock()
	w1, w2 := kvroute.WorkerKey{ID: 1}, kvroute.WorkerKey{ID: 2}
	var r *router.Router
	checked := false
	log := slog.New(hookHandler{hook: func(rec slog.Record) {
		if rec.Message != "worker health changed" || recordAttr(rec, "worker") != w1.String() {
			return
		}
		// The first check has judged worker 1 and not yet worker 2: a
		// second check, later, judges both.
		if !checked {
			checked = true
			clock.Advance(15 * time.Second)
			r.CheckHealth()
		}
	}})
	r = newRouter(t, router.Config{Clock: clock, Logger: log}, newEngine(1), newEngine(2))
	for _, w := range []kvroute.WorkerKey{w1, w2} {
		require.NoError(t, r.Heartbeat(w, scheduling.Load{}))
	}
	clock.Advance(6 * time.Second) // both heartbeats late: degraded
	r.CheckHealth()
	for _, w := range []kvroute.WorkerKey{w1, w2} {
		h, ok := r.Health(w)
		require.True(t, ok)
		require.Equal(t, router.Unhealthy, h, "worker %s, 21 s after its last heartbeat", w)
	}
	for _, ws := range r.Stats().Workers {
		require.Equal(t, router.Unhealthy, ws.Health, "worker %s in Stats", ws.Worker)
	}
	_, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 2, 0, 0)})
	require.ErrorIs(t, err, router.ErrNoWorkers, "a worker judged unhealthy is still routed to")
}
