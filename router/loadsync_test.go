package router_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// countingSync counts, per request id, the LoadSync calls that start and
// end it.
type countingSync struct {
	mu    sync.Mutex
	added map[scheduling.RequestID]int
	freed map[scheduling.RequestID]int
}

func (s *countingSync) Added(id scheduling.RequestID, _ kvroute.WorkerKey, _ []kvroute.SeqHash, _ int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.added[id]++
}

func (s *countingSync) PrefillDone(scheduling.RequestID)       {}
func (s *countingSync) OutputTokens(scheduling.RequestID, int) {}

func (s *countingSync) Freed(id scheduling.RequestID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.freed[id]++
}

// LoadSync.Freed comes exactly once per request the router tracked,
// including a disaggregated request's prefill, which ends at PrefillDone
// or, without one, at Done.
func TestLoadSyncFreedOncePerRequest(t *testing.T) {
	tests := []struct {
		name string
		end  func(d *router.Decision)
	}{
		{"prefill done, then done", func(d *router.Decision) { d.PrefillDone(); d.Done(router.Outcome{}) }},
		{"done without prefill done", func(d *router.Decision) { d.Done(router.Outcome{}) }},
		{"done twice, prefill done after", func(d *router.Decision) {
			d.Done(router.Outcome{})
			d.Done(router.Outcome{})
			d.PrefillDone()
		}},
		{"prefill done and done at once", func(d *router.Decision) {
			var wg sync.WaitGroup
			wg.Go(d.PrefillDone)
			wg.Go(func() { d.Done(router.Outcome{}) })
			wg.Wait()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ls := &countingSync{added: map[scheduling.RequestID]int{}, freed: map[scheduling.RequestID]int{}}
			p, dec := newEngine(1), newEngine(2)
			p.role, dec.role = router.RolePrefill, router.RoleDecode
			r := newRouter(t, router.Config{LoadSync: ls}, p, dec)
			for i := range 50 {
				d, err := r.Select(context.Background(), &router.Request{Tokens: tokens(1, 4, i, 1)})
				require.NoError(t, err)
				require.True(t, d.Disaggregated)
				tt.end(d)
			}
			require.Len(t, ls.added, 100, "a prefill and a decode request per decision")
			for id, n := range ls.added {
				require.Equal(t, 1, n, "request %d added", id)
				require.Equal(t, 1, ls.freed[id], "request %d freed", id)
			}
			require.Len(t, ls.freed, 100)
			require.Zero(t, r.Tracker().Len())
		})
	}
}
