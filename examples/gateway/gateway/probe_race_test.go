package gateway_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/router"
)

// runGateway runs gw until the test ends and checks that Run returns nil.
// Servers the gateway talks to are closed in cleanups registered before
// it, so that they close after the gateway stopped.
func runGateway(t *testing.T, ctx context.Context, gw *gateway.Gateway) {
	t.Helper()
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- gw.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-ran)
	})
}

// TestProbeOfAReplacedEngineIsDropped: an engine removed and added again
// under its id while a health probe of it is under way is not judged by
// that probe's failure, which concerns the engine it replaced.
func TestProbeOfAReplacedEngineIsDropped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(started) })
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(old.Close)
	newProbed := make(chan struct{}, 1)
	replacement := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case newProbed <- struct{}{}:
		default:
		}
		<-r.Context().Done() // answers only when the gateway gives up
	}))
	t.Cleanup(replacement.Close)

	// One failed probe makes a worker degraded.
	r, err := router.New(router.Config{Health: router.HealthConfig{DegradedErrors: 1}})
	require.NoError(t, err)
	gw, err := gateway.New(gateway.Config{Router: r, HealthInterval: 5 * time.Millisecond, HealthTimeout: 10 * time.Second,
		Engines: []gateway.Engine{{ID: 1, URL: old.URL, Preset: gateway.PresetDynamo}}})
	require.NoError(t, err)
	runGateway(t, ctx, gw)

	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("no probe")
	}
	require.True(t, gw.RemoveEngine(1))
	require.NoError(t, gw.AddEngine(gateway.Engine{ID: 1, URL: replacement.URL, Preset: gateway.PresetDynamo}))
	close(release) // the old engine's probe fails now
	// The next round probes the replacement: the last one is over.
	select {
	case <-newProbed:
	case <-ctx.Done():
		t.Fatal("the replacement is never probed")
	}
	h, ok := r.Health(kvroute.WorkerKey{ID: 1})
	require.True(t, ok)
	require.Equal(t, router.Healthy, h, "the replaced engine's failed probe counted against its successor")
}

// logHook is a slog.Handler that calls fn with each record's message.
type logHook struct{ fn func(msg string) }

func (h logHook) Enabled(context.Context, slog.Level) bool      { return true }
func (h logHook) Handle(_ context.Context, r slog.Record) error { h.fn(r.Message); return nil }
func (h logHook) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h logHook) WithGroup(string) slog.Handler                 { return h }

// TestRemoveAfterSparesAReplacedEngine: an engine found unhealthy for
// RemoveAfter, removed and added again under its id before the removal
// takes place, is not removed: the removal concerned its predecessor.
func TestRemoveAfterSparesAReplacedEngine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(dead.Close)
	var mu sync.Mutex
	healthyProbes := 0
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		healthyProbes++
		mu.Unlock()
	}))
	t.Cleanup(healthy.Close)

	r, err := router.New(router.Config{})
	require.NoError(t, err)
	var gw *gateway.Gateway
	var replaced sync.Once
	hook := logHook{fn: func(msg string) {
		if msg != "removing engine unhealthy for too long" {
			return
		}
		// Between the decision and the removal, the operator replaces
		// the engine.
		replaced.Do(func() {
			require.True(t, gw.RemoveEngine(1))
			require.NoError(t, gw.AddEngine(gateway.Engine{ID: 1, URL: healthy.URL, Preset: gateway.PresetDynamo}))
		})
	}}
	gw, err = gateway.New(gateway.Config{Router: r, HealthInterval: 5 * time.Millisecond, HealthTimeout: 5 * time.Second,
		RemoveAfter: 20 * time.Millisecond, Logger: slog.New(hook),
		Engines: []gateway.Engine{{ID: 1, URL: dead.URL, Preset: gateway.PresetDynamo}}})
	require.NoError(t, err)
	runGateway(t, ctx, gw)

	// A few rounds after the replacement, it is still there.
	for {
		mu.Lock()
		n := healthyProbes
		mu.Unlock()
		if n >= 5 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the replacement was probed %d times; workers %v", n, r.Workers())
		case <-time.After(5 * time.Millisecond):
		}
	}
	require.True(t, slices.Contains(r.Workers(), kvroute.WorkerKey{ID: 1}), "the replacement was removed")
	h, _ := r.Health(kvroute.WorkerKey{ID: 1})
	require.Equal(t, router.Healthy, h)
}

// TestAddEngineDuringItsRemoval: an engine added again under the id of one
// being removed (its event subscribers stopping) waits for that removal,
// where the router, still holding the old worker, refused it.
func TestAddEngineDuringItsRemoval(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	// The events endpoint listens nowhere: the subscriber dials until it
	// is stopped, which RemoveEngine waits for.
	e := gateway.Engine{ID: 1, URL: "http://127.0.0.1:9", Events: "tcp://127.0.0.1:9"}
	gw, err := gateway.New(gateway.Config{Router: r, Engines: []gateway.Engine{e}})
	require.NoError(t, err)
	runGateway(t, ctx, gw)
	for i := range 50 {
		removed := make(chan bool)
		go func() { removed <- gw.RemoveEngine(1) }()
		for {
			err := gw.AddEngine(e)
			if errors.Is(err, gateway.ErrDuplicateEngine) {
				continue // the removal has not begun
			}
			require.NoError(t, err, "round %d", i)
			break
		}
		require.True(t, <-removed)
		require.Equal(t, []kvroute.WorkerKey{{ID: 1}}, r.Workers())
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
	}
}
