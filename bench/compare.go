package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sync/errgroup"
)

// Compare runs workload wl once per policy on clusters configured by cfg
// and returns the results in the order of policies. Runs are independent
// and deterministic; up to parallel of them run at once (zero means
// GOMAXPROCS). cfg.Progress, when set, is called with the finished requests
// summed over all runs and the total over all runs, from the runs'
// goroutines one at a time.
func Compare(ctx context.Context, cfg Config, wl *Workload, policies []Policy, parallel int) ([]Result, error) {
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	results := make([]Result, len(policies))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	var mu sync.Mutex // serialises cfg.Progress and guards done
	done := make([]int, len(policies))
	total := len(wl.Requests) * len(policies)
	for i, p := range policies {
		runCfg := cfg
		if cfg.Progress != nil {
			runCfg.Progress = func(n, _ int) {
				mu.Lock()
				defer mu.Unlock()
				done[i] = n
				sum := 0
				for _, d := range done {
					sum += d
				}
				cfg.Progress(sum, total)
			}
		}
		g.Go(func() error {
			res, err := Run(ctx, runCfg, wl, p)
			if err != nil {
				return fmt.Errorf("bench: %s: %w", p.Name, err)
			}
			results[i] = res
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return results, nil
}
