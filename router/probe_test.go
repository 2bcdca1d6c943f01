package router_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// A probe's result reaches the worker registered when the probe started,
// and only it: a worker removed (and perhaps added again under its id)
// while the probe was out does not get the old one's failures, nor its
// load report, while an update keeps the incarnation and its probes.
func TestProbeOfAnEarlierIncarnation(t *testing.T) {
	w1 := kvroute.WorkerKey{ID: 1}
	report := scheduling.Load{MaxRequests: 7, ActiveRequests: 5}
	tests := []struct {
		name string
		// between runs while the probes are out.
		between func(t *testing.T, r *router.Router)
		// current says the probes still concern the registered worker.
		current bool
	}{
		{"nothing", func(*testing.T, *router.Router) {}, true},
		{"updated", func(t *testing.T, r *router.Router) {
			require.NoError(t, r.UpdateWorker(router.StaticWorker{WorkerID: 1, Block: bs, Requests: 4}))
		}, true},
		{"removed", func(t *testing.T, r *router.Router) { require.True(t, r.RemoveWorker(1)) }, false},
		{"removed and added again", readd, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, router.Config{}, newEngine(1), newEngine(2))
			var probes []router.Probe
			for range 5 {
				p, err := r.Probe(w1)
				require.NoError(t, err)
				require.Equal(t, w1, p.Worker())
				probes = append(probes, p)
			}
			tt.between(t, r)
			for i, p := range probes {
				var err error
				switch i {
				case 0:
					err = p.Report(report)
				case 1:
					err = p.Alive()
				default:
					err = p.Failed(errors.New("connection refused"))
				}
				if tt.current {
					require.NoError(t, err)
				} else {
					require.ErrorIs(t, err, router.ErrUnknownWorker)
				}
			}
			h, registered := r.Health(w1)
			var reported scheduling.Load
			for _, ws := range r.Stats().Workers {
				if ws.Worker == w1 {
					reported = ws.Reported
				}
			}
			switch {
			case tt.current:
				require.Equal(t, router.Degraded, h, "three failed probes")
				require.Equal(t, report, reported, "the report the probe brought back, which Alive kept")
			case registered:
				require.Equal(t, router.Healthy, h, "the old worker's failed probes counted against the new one")
				require.Zero(t, reported, "the old worker's report was applied to the new one")
			}
		})
	}
}

// A probe of a worker that is not registered cannot start.
func TestProbeOfAnUnknownWorker(t *testing.T) {
	r := newRouter(t, router.Config{}, newEngine(1))
	_, err := r.Probe(kvroute.WorkerKey{ID: 1, Rank: 1})
	require.ErrorIs(t, err, router.ErrUnknownWorker)
	var zero router.Probe
	require.ErrorIs(t, zero.Alive(), router.ErrUnknownWorker)
	require.Equal(t, kvroute.WorkerKey{}, zero.Worker())
}
