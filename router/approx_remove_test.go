package router_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// In approximate mode, a decision made for a worker that is removed (and
// perhaps added again) before the decision records its blocks records
// nothing: the removal cleared the worker's blocks, and the decision's
// blocks would otherwise stay in the index for a worker that is gone, or
// be taken for the cache of the one added under its id since.
func TestApproximateDecisionDuringRemoval(t *testing.T) {
	w1, w2 := kvroute.WorkerKey{ID: 1}, kvroute.WorkerKey{ID: 2}
	tests := []struct {
		name   string
		readd  bool
		update bool // the removal is an update that drops the rank
	}{
		{"removed", false, false},
		{"removed and added again", true, false},
		{"its rank dropped by an update", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r *router.Router
			removing := false
			e1 := newEngine(1)
			e1.ranks = 2
			cost := scheduling.CostFuncFunc(func(_ *scheduling.Request, cands []scheduling.Candidate, costs []float64) {
				for i := range cands {
					costs[i] = float64(2*int(cands[i].Worker.ID) + int(cands[i].Worker.Rank)) // worker 1 rank 0 is the cheapest
				}
				if removing {
					removing = false
					switch {
					case tt.update:
						e1.ranks = 1
						require.NoError(t, r.UpdateWorker(e1))
					default:
						require.True(t, r.RemoveWorker(1))
						if tt.readd {
							require.NoError(t, r.AddWorker(newEngine(1)))
						}
					}
				}
			})
			r = newRouter(t, router.Config{Approximate: true, Cost: cost}, e1, newEngine(2))
			ctx := context.Background()
			chosen := kvroute.WorkerKey{ID: 1}
			req := &router.Request{Tokens: tokens(1, 4, 0, 0)}
			if tt.update {
				chosen = kvroute.WorkerKey{ID: 1, Rank: 1}
				req.Pin, req.HasPin = chosen, true
			}
			removing = true
			d, err := r.Select(ctx, req)
			require.NoError(t, err)
			require.Equal(t, chosen, d.Worker, "chosen from the snapshot the decision started on")
			d.Done(router.Outcome{})
			require.Empty(t, r.Index().AppendWorkerBlocks(chosen, nil), "blocks recorded for the worker that left")
			require.NotContains(t, r.Index().Workers(), chosen)

			// The workers that stay record their decisions.
			d, err = r.Select(ctx, &router.Request{Tokens: tokens(2, 4, 0, 0), Exclude: []kvroute.WorkerKey{w1}})
			require.NoError(t, err)
			require.Equal(t, w2, d.Worker)
			d.Done(router.Outcome{})
			require.Len(t, r.Index().AppendWorkerBlocks(w2, nil), 4)
		})
	}
}
