package gateway

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/router"
)

// With health probes disabled, Run still does the router's timed
// housekeeping: an engine made unhealthy by errors is forgiven after the
// router's UnhealthyAfter and routed to again, instead of staying out of
// rotation for good (no probe, heartbeat or request would re-judge it).
func TestRunWithoutProbesKeepsHealthCurrent(t *testing.T) {
	clock := clocktest.New(time.Unix(1_000_000, 0))
	r, err := router.New(router.Config{Clock: clock})
	require.NoError(t, err)
	g, err := New(Config{Router: r, HealthInterval: -1, Engines: []Engine{{ID: 1, URL: "http://127.0.0.1:1"}}})
	require.NoError(t, err)
	w1 := kvroute.WorkerKey{ID: 1}
	for range 5 {
		require.NoError(t, r.ReportError(w1, errors.New("connection refused")))
	}
	h, _ := r.Health(w1)
	require.Equal(t, router.Unhealthy, h)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	clock.Advance(time.Minute) // past UnhealthyAfter without a new error
	require.Eventually(t, func() bool {
		h, _ := r.Health(w1)
		return h == router.Healthy
	}, 5*time.Second, 10*time.Millisecond, "the engine stays unhealthy")
	cancel()
	require.NoError(t, <-done)
}

// When Run ends, the connection its probes left idle to an engine is
// closed, not left open until the transport's idle timeout.
func TestRunClosesIdleConnections(t *testing.T) {
	var open, probes atomic.Int32
	engine := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { probes.Add(1) }))
	engine.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	engine.Start()
	t.Cleanup(engine.Close)
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	g, err := New(Config{Router: r, HealthInterval: time.Hour, Engines: []Engine{{ID: 1, URL: engine.URL}}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	require.Eventually(t, func() bool { return probes.Load() == 1 }, 5*time.Second, time.Millisecond, "the first probe")
	require.EqualValues(t, 1, open.Load())
	cancel()
	require.NoError(t, <-done)
	require.Eventually(t, func() bool { return open.Load() == 0 }, 5*time.Second, time.Millisecond,
		"the probe's connection stays open")
}
