package main

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// An engine that answers every probe of the gateway's -health-interval,
// however long, is not judged late between two probes: one failed
// request then does not take it out of rotation until the next probe.
// One that stops answering still becomes unhealthy.
func TestHealthFollowsTheProbeInterval(t *testing.T) {
	for _, interval := range []time.Duration{500 * time.Millisecond, 2 * time.Second, 10 * time.Second, time.Minute} {
		t.Run(interval.String(), func(t *testing.T) {
			clock := clocktest.New(time.Unix(1_000_000, 0))
			r, err := router.New(router.Config{Clock: clock, Health: healthConfig(interval)})
			require.NoError(t, err)
			require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 1}))
			w := kvroute.WorkerKey{ID: 1}
			require.NoError(t, r.Heartbeat(w, scheduling.Load{}))
			// The next probe started an interval later and took its
			// whole timeout (the interval) to succeed; meanwhile a
			// request failed.
			clock.Advance(2*interval - time.Millisecond)
			require.NoError(t, r.ReportError(w, errors.New("502 bad gateway")))
			h, _ := r.Health(w)
			require.Equal(t, router.Healthy, h, "judged late between two probes")
			require.NoError(t, r.Heartbeat(w, scheduling.Load{}))

			clock.Advance(max(15*time.Second, 10*interval)) // no probe answered since
			r.CheckHealth()
			h, _ = r.Health(w)
			require.Equal(t, router.Unhealthy, h)
		})
	}
}
