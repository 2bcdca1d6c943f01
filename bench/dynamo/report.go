package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/stats"
)

// table prints, per scenario, the median of each metric over the
// repetitions of every arm, and kvroute's ratios to Dynamo's KV router.
func (b *bench) table(scens []*Scenario) {
	fmt.Fprintf(b.out, "\nMedians over %d repetitions (min–max in brackets):\n\n", b.o.reps)
	fmt.Fprintln(b.out, "| scenario | arm | TTFT p50 (ms) | TTFT p99 (ms) | throughput (req/s) | cached fraction | max requests on a worker | uneven time | kvroute predictions within a block |")
	fmt.Fprintln(b.out, "|---|---|---|---|---|---|---|---|---|")
	for _, s := range scens {
		for _, arm := range b.o.arms {
			sums := b.sums[s.Name+"/"+arm]
			if len(sums) == 0 {
				continue
			}
			acc := "–"
			if p, e := sumInt(sums, func(s Summary) int { return s.Predicted }), sumInt(sums, func(s Summary) int { return s.Exact }); p > 0 {
				acc = fmt.Sprintf("%.1f%%", 100*float64(e)/float64(p))
			}
			fmt.Fprintf(b.out, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.Name, arm,
				stat(sums, func(s Summary) float64 { return ms(s.TTFTp50) }, "%.1f"),
				stat(sums, func(s Summary) float64 { return ms(s.TTFTp99) }, "%.1f"),
				stat(sums, func(s Summary) float64 { return s.Throughput }, "%.2f"),
				stat(sums, func(s Summary) float64 { return s.CachedFraction }, "%.3f"),
				stat(sums, func(s Summary) float64 { return float64(s.PerWorker[0]) }, "%.0f"),
				stat(sums, func(s Summary) float64 { return 100 * s.Uneven }, "%.0f%%"),
				acc)
		}
	}
	var ratios []string
	for _, s := range scens {
		base, ok := b.sums[s.Name+"/dynamo-kv"]
		if !ok {
			continue
		}
		for _, arm := range b.o.arms {
			if !strings.HasPrefix(arm, "kvroute") {
				continue
			}
			kv, ok := b.sums[s.Name+"/"+arm]
			if !ok {
				continue
			}
			r := func(f func(Summary) float64) float64 { return median(kv, f) / median(base, f) }
			ratios = append(ratios, fmt.Sprintf("| %s | %s | %.2f | %.2f | %.2f | %.2f |", s.Name, arm,
				r(func(s Summary) float64 { return ms(s.TTFTp50) }),
				r(func(s Summary) float64 { return ms(s.TTFTp99) }),
				r(func(s Summary) float64 { return s.Throughput }),
				r(func(s Summary) float64 { return s.CachedFraction })))
		}
	}
	if len(ratios) > 0 {
		fmt.Fprintln(b.out, "\nkvroute / Dynamo's KV router (ratio of medians; targets: TTFT p50 ≤ 0.70 and cached ≥ 1.30 on the two prompt scenarios, p99 ≤ 1.05 and throughput ≥ 0.95 on all):")
		fmt.Fprintln(b.out)
		fmt.Fprintln(b.out, "| scenario | arm | TTFT p50 | TTFT p99 | throughput | cached fraction |")
		fmt.Fprintln(b.out, "|---|---|---|---|---|---|")
		for _, l := range ratios {
			fmt.Fprintln(b.out, l)
		}
	}
	fmt.Fprintln(b.out, "\nWhere the TTFT goes, over all repetitions: requests by the requests in flight on their worker when they were sent, hits and misses, and where the misses went:")
	fmt.Fprintln(b.out)
	fmt.Fprintln(b.out, arrivalHeader)
	for _, s := range scens {
		for _, arm := range b.o.arms {
			if a := b.arrivals[s.Name+"/"+arm]; a != nil {
				for _, l := range arrivalRows(s.Name, arm, *a) {
					fmt.Fprintln(b.out, l)
				}
			}
		}
	}
}

func sumInt(s []Summary, f func(Summary) int) int {
	n := 0
	for _, x := range s {
		n += f(x)
	}
	return n
}

func values(s []Summary, f func(Summary) float64) []float64 {
	v := make([]float64, len(s))
	for i, x := range s {
		v[i] = f(x)
	}
	slices.Sort(v)
	return v
}

func median(s []Summary, f func(Summary) float64) float64 { return stats.Median(values(s, f)) }

func stat(s []Summary, f func(Summary) float64, format string) string {
	v := values(s, f)
	if len(v) == 1 {
		return fmt.Sprintf(format, v[0])
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", median(s, f), v[0], v[len(v)-1])
}

var _ = time.Second
