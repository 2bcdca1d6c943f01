package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	kvzmq "github.com/kvroute/kvroute/kvevents/zmq"
	"github.com/kvroute/kvroute/router"
)

// Run called again while the previous Run is still stopping its
// subscribers is refused, so that the new Run never starts (and loses)
// subscribers that are still running.
func TestRunIsNotReenteredDuringShutdown(t *testing.T) {
	// A live publisher: connected subscribers take a moment to stop.
	pub := zmq4.NewPub(context.Background())
	t.Cleanup(func() { _ = pub.Close() })
	require.NoError(t, pub.Listen("tcp://127.0.0.1:0"))
	events := "tcp://" + pub.Addr().String()
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	g, err := New(Config{Router: r, HealthInterval: time.Hour, Engines: []Engine{
		{ID: 1, URL: "http://127.0.0.1:1", Events: events},
		{ID: 2, URL: "http://127.0.0.1:1", Events: events},
	}})
	require.NoError(t, err)
	connects := func() map[*kvzmq.Subscriber]uint64 {
		m := map[*kvzmq.Subscriber]uint64{}
		for _, eng := range g.engines {
			for _, s := range eng.subs {
				m[s] = s.Stats().Reconnects
			}
		}
		return m
	}
	for try := range 8 {
		before := connects()
		ctx1, cancel1 := context.WithCancel(context.Background())
		done1 := make(chan struct{})
		go func() {
			defer close(done1)
			require.NoError(t, g.Run(ctx1))
		}()
		require.Eventually(t, func() bool {
			g.mu.RLock()
			running := g.runCtx == ctx1
			g.mu.RUnlock()
			for s, n := range connects() {
				if n == before[s] {
					return false
				}
			}
			return running
		}, 10*time.Second, time.Millisecond, "the subscribers connect")
		cancel1()
		ctx2, cancel2 := context.WithCancel(context.Background())
		done2 := make(chan error, 1)
		for {
			go func() { done2 <- g.Run(ctx2) }()
			select {
			case err := <-done2:
				require.ErrorIs(t, err, ErrRunning, "try %d", try)
				continue // still stopping: refused
			case <-time.After(50 * time.Millisecond):
			}
			break
		}
		select {
		case <-done1:
		default:
			t.Fatalf("try %d: Run started again before the previous one stopped", try)
		}
		// The new Run owns every subscriber: each one runs (a probe with
		// an ended context is refused).
		for _, eng := range g.engines {
			for _, s := range eng.subs {
				require.Eventually(t, func() bool {
					probe, cancel := context.WithCancel(context.Background())
					cancel()
					return errors.Is(s.Run(probe), kvzmq.ErrRunning)
				}, 5*time.Second, 20*time.Millisecond, "try %d: a subscriber is not running", try)
			}
		}
		cancel2()
		require.NoError(t, <-done2)
	}
}
