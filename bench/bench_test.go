package bench

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkSimulate runs a reduced workload (a), 1,000 requests on 4
// engines, once per iteration and policy, and reports what the run measured:
// token hit rate, TTFT p50 and p99 in virtual milliseconds, load imbalance,
// router time per decision, and simulated requests per wall second.
func BenchmarkSimulate(b *testing.B) {
	for _, tc := range []struct {
		scenario string
		requests int
	}{
		{"a", 1000},
		{"c", 500},
	} {
		sc, err := NewScenario(tc.scenario, ScenarioOptions{Requests: tc.requests, Seed: 1})
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range Policies() {
			b.Run(fmt.Sprintf("workload=%s/policy=%s/requests=%d", tc.scenario, p.Name, tc.requests), func(b *testing.B) {
				b.ReportAllocs()
				var r Result
				for b.Loop() {
					if r, err = Run(context.Background(), sc.Config, sc.Workload, p); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(100*r.HitRate, "hit%")
				b.ReportMetric(float64(r.TTFT.P50)/float64(time.Millisecond), "ttft-p50-ms")
				b.ReportMetric(float64(r.TTFT.P99)/float64(time.Millisecond), "ttft-p99-ms")
				b.ReportMetric(r.LoadImbalance, "max/mean")
				b.ReportMetric(float64(r.Select.Mean)/float64(time.Microsecond), "µs/decision")
				b.ReportMetric(float64(r.Requests)/r.WallTime.Seconds(), "sim-req/s")
			})
		}
	}
}
