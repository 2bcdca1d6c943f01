// Command kvsweep searches kvroute's cost parameters on a simulated
// scenario: it runs every combination of NVIDIA Dynamo's cost weights and
// load bounds given on the command line, beside Dynamo's default cost and
// kvroute's default, on the scenario's workload for several seeds, and
// prints each configuration's hit rate, throughput and TTFT relative to
// Dynamo's default cost on the same workload: the median over the seeds
// and the worst seed.
//
// Usage:
//
//	go run ./bench/cmd/kvsweep -workload e -seeds 12 -overlap 1,2,3 -bound none,requests:2,kv:2
//
// Each configuration is scheduling.DynamoCost with the overlap weight,
// prefill load scale, active-request weight and KV-pressure weight of one
// combination of -overlap, -prefill-scale, -active and -kv, inside
// scheduling.BoundedLoad when its -bound is requests:F (at most F times the
// mean of the requests in flight) or kv:F (of the distinct active KV
// blocks), the router counting the load of its own requests as kvroute's
// default does. Rows are sorted by the median hit-rate ratio; -min-throughput
// leaves out configurations whose median throughput ratio is below it.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/bench"
	"github.com/kvroute/kvroute/internal/stats"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "kvsweep:", err)
		os.Exit(1)
	}
}

// bound is a load bound of the sweep: none, or a factor on a measure.
type bound struct {
	name string                        // as given: none, requests:F or kv:F
	cfg  *scheduling.BoundedLoadConfig // nil for none
}

func parseBounds(s string) ([]bound, error) {
	var out []bound
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "none" {
			out = append(out, bound{name: f})
			continue
		}
		kind, factor, ok := strings.Cut(f, ":")
		v, err := strconv.ParseFloat(factor, 64)
		if !ok || err != nil || !(v >= 1) {
			return nil, fmt.Errorf("bound %q: want none, requests:F or kv:F with F ≥ 1", f)
		}
		var m scheduling.LoadMeasure
		switch kind {
		case "requests":
			m = scheduling.MeasureRequests
		case "kv":
			m = scheduling.MeasureKVBlocks
		default:
			return nil, fmt.Errorf("bound %q: want none, requests:F or kv:F", f)
		}
		out = append(out, bound{f, &scheduling.BoundedLoadConfig{Factor: v, Measure: m}})
	}
	return out, nil
}

func parseFloats(name, s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v >= 0) {
			return nil, fmt.Errorf("-%s: %q is not a non-negative number", name, f)
		}
		out = append(out, v)
	}
	return out, nil
}

// sweepPolicy is one configuration of the sweep.
func sweepPolicy(ow, pls, arw, kvp float64, b bound) bench.Policy {
	name := fmt.Sprintf("overlap %g, prefill scale %g, active %g, kv %g, bound %s", ow, pls, arw, kvp, b.name)
	cfg := scheduling.DynamoCostConfig{
		OverlapWeight: scheduling.Float(ow), PrefillLoadScale: scheduling.Float(pls),
		ActiveRequestWeight: arw, KVPressureWeight: kvp,
	}
	return bench.Policy{
		Name:        name,
		Description: name,
		Configure: func(kvroute.Clock) (router.Config, error) {
			return bench.DynamoCostUnder(cfg, b.cfg)
		},
		OwnLoad: true,
	}
}

// ratios are one configuration's results relative to Dynamo's default
// cost, one per seed.
type ratios struct{ hit, throughput, p50, p99 []float64 }

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvsweep", flag.ContinueOnError)
	fs.SetOutput(stderr)
	workload := fs.String("workload", "e", "scenario: a to f (bench.NewScenario; d needs -trace)")
	seeds := fs.Int("seeds", 12, "workload seeds 1..N")
	requests := fs.Int("requests", 0, "requests per run (0: the scenario's default)")
	trace := fs.String("trace", "", "Mooncake JSONL trace for scenario d")
	overlap := fs.String("overlap", "1,2,3", "overlap weights")
	prefillScale := fs.String("prefill-scale", "1,16", "prefill load scales")
	active := fs.String("active", "0,16", "blocks of cost per active request")
	kv := fs.String("kv", "0,8000", "KV-pressure weights (blocks for a whole cache held in flight)")
	bounds := fs.String("bound", "none,requests:2,kv:2", "load bounds: none, requests:F, kv:F")
	minThroughput := fs.Float64("min-throughput", 0, "leave out configurations whose median throughput ratio is below this")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *seeds < 1 {
		return fmt.Errorf("-seeds %d: want at least 1", *seeds)
	}
	grids := make([][]float64, 4)
	for i, f := range []struct{ name, value string }{{"overlap", *overlap}, {"prefill-scale", *prefillScale}, {"active", *active}, {"kv", *kv}} {
		v, err := parseFloats(f.name, f.value)
		if err != nil {
			return err
		}
		grids[i] = v
	}
	bs, err := parseBounds(*bounds)
	if err != nil {
		return err
	}
	dynamo, err := bench.PolicyByName("dynamo")
	if err != nil {
		return err
	}
	pols := []bench.Policy{dynamo, bench.KVRoutePolicy()}
	for _, ow := range grids[0] {
		for _, pls := range grids[1] {
			for _, arw := range grids[2] {
				for _, kvp := range grids[3] {
					for _, b := range bs {
						pols = append(pols, sweepPolicy(ow, pls, arw, kvp, b))
					}
				}
			}
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res := make([]ratios, len(pols))
	for seed := 1; seed <= *seeds; seed++ {
		sc, err := bench.NewScenario(*workload, bench.ScenarioOptions{Requests: *requests, Seed: uint64(seed), TracePath: *trace})
		if err != nil {
			return err
		}
		results, err := bench.Compare(ctx, sc.Config, sc.Workload, pols, 0)
		if err != nil {
			return err
		}
		base := results[0]
		for i, r := range results {
			res[i].hit = append(res[i].hit, r.HitRate/base.HitRate)
			res[i].throughput = append(res[i].throughput, r.Throughput/base.Throughput)
			res[i].p50 = append(res[i].p50, float64(r.TTFT.P50)/float64(base.TTFT.P50))
			res[i].p99 = append(res[i].p99, float64(r.TTFT.P99)/float64(base.TTFT.P99))
		}
		fmt.Fprintf(stderr, "seed %d of %d done\n", seed, *seeds)
	}

	order := make([]int, len(pols))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(stats.Median(res[b].hit), stats.Median(res[a].hit)) })
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\thit\thit_min\tthroughput\tthroughput_min\tttft_p50\tttft_p50_max\tttft_p99\tttft_p99_max\t\n")
	for _, i := range order {
		r := res[i]
		if stats.Median(r.throughput) < *minThroughput && i > 1 {
			continue
		}
		name := pols[i].Name
		if i == 1 {
			name = "kvroute's default"
		} else if i == 0 {
			name = "Dynamo's default cost"
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t\n", name,
			stats.Median(r.hit), slices.Min(r.hit), stats.Median(r.throughput), slices.Min(r.throughput),
			stats.Median(r.p50), slices.Max(r.p50), stats.Median(r.p99), slices.Max(r.p99))
	}
	return tw.Flush()
}
