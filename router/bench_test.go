package router_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/cputime"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// Benchmark cluster: an index of 1M blocks (1,024 chains of 1,024 blocks of
// 16 tokens, so each chain is a 16K-token prompt), every chain held by two
// of the workers. A 1K-token request is the first 64 blocks of a chain plus
// nothing else, so it matches on two workers and competes with the load of
// all the others.
const (
	benchChains = 1024
	benchDepth  = 1024
)

type benchCluster struct {
	r      *router.Router
	prompt [][]uint32 // per chain, its 16K tokens
}

var (
	clustersMu sync.Mutex
	clusters   = map[int]*benchCluster{}
)

func benchTokens(c int) []uint32 {
	rng := rand.New(rand.NewPCG(uint64(c), 99))
	toks := make([]uint32, benchDepth*bs)
	for i := range toks {
		toks[i] = uint32(rng.IntN(151936))
	}
	return toks
}

func cluster(b *testing.B, workers int) *benchCluster {
	clustersMu.Lock()
	defer clustersMu.Unlock()
	if c, ok := clusters[workers]; ok {
		return c
	}
	r, err := router.New(router.Config{Hasher: hasher, Selector: scheduling.SelectorConfig{Seed: 7}})
	if err != nil {
		b.Fatal(err)
	}
	for w := range workers {
		if err := r.AddWorker(router.StaticWorker{WorkerID: kvroute.WorkerID(w), Block: bs, BatchedTokens: 8192, Requests: 256}); err != nil {
			b.Fatal(err)
		}
	}
	c := &benchCluster{r: r}
	ev := kvroute.Event{Kind: kvroute.EventStored}
	for ch := range benchChains {
		toks := benchTokens(ch)
		c.prompt = append(c.prompt, toks)
		blocks := hasher.AppendBlockHashes(nil, toks)
		for _, w := range []int{ch % workers, (ch + 1) % workers} {
			ev.Worker = kvroute.WorkerKey{ID: kvroute.WorkerID(w)}
			ev.Blocks = ev.Blocks[:0]
			for i, h := range blocks {
				ev.Blocks = append(ev.Blocks, kvroute.StoredBlock{External: kvroute.ExternalHash(ch<<20 | i), Hash: h})
			}
			if err := r.Index().Apply(&ev); err != nil {
				b.Fatal(err)
			}
		}
	}
	clusters[workers] = c
	return c
}

// p99 returns the 99th percentile of the sampled latencies.
func p99(samples []time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	slices.Sort(samples)
	return samples[len(samples)*99/100]
}

// BenchmarkSelect routes requests against the 1M-block index, completing
// each decision (PrefillDone, Done) before the next, as a steady stream
// would. dist=uniform draws every prompt from all 1,024 chains, so the
// index walk is mostly cold; dist=zipf draws them with Zipf's law (s=1.1),
// as popular system prompts and sessions make real traffic.
//
// Besides the wall-clock decisions/s and p99 it reports, on Linux,
// cpu-ns/decision and decisions/cpu-s: the CPU time the loop used (one
// goroutine: its thread's; parallel: the process's, over both cores). On a
// shared machine other processes take turns on the cores and inflate
// wall-clock time; CPU time is the cost of the work (cache interference
// from the neighbours aside), and a parallel run whose CPU time per
// decision stays that of one goroutine scales with the cores.
func BenchmarkSelect(b *testing.B) {
	ctx := context.Background()
	for _, workers := range []int{8, 64, 512} {
		for _, p := range []struct {
			name   string
			tokens int
		}{{"1k", 1024}, {"16k", 16384}} {
			for _, dist := range []string{"uniform", "zipf"} {
				benchSelect(b, ctx, workers, p.name, p.tokens, dist)
			}
		}
	}
}

// reportSelect reports the decisions per second, the p99 latency of the
// sampled decisions and, when known, the CPU time of the loop per decision.
func reportSelect(b *testing.B, samples []time.Duration, cpuOK bool, cpuNs int64) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric(float64(p99(samples).Nanoseconds()), "p99-ns")
	if cpuOK && cpuNs > 0 {
		per := float64(cpuNs) / float64(b.N)
		b.ReportMetric(per, "cpu-ns/decision")
		b.ReportMetric(1e9/per, "decisions/cpu-s")
	}
}

// chooser returns a generator of chain numbers for dist.
func chooser(dist string, seed uint64) func() int {
	rng := rand.New(rand.NewPCG(seed, 2))
	if dist == "zipf" {
		z := rand.NewZipf(rng, 1.1, 1, benchChains-1)
		return func() int { return int(z.Uint64()) }
	}
	return func() int { return rng.IntN(benchChains) }
}

func benchSelect(b *testing.B, ctx context.Context, workers int, name string, tokens int, dist string) {
	p := struct {
		name   string
		tokens int
	}{name, tokens}
	{
		{
			b.Run(fmt.Sprintf("workers=%d/prompt=%s/dist=%s", workers, p.name, dist), func(b *testing.B) {
				c := cluster(b, workers)
				next := chooser(dist, 1)
				var d router.Decision
				samples := make([]time.Duration, 0, 1<<16)
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				b.ReportAllocs()
				b.ResetTimer()
				cpu0, cpuOK := cputime.Thread()
				for b.Loop() {
					req := router.Request{Tokens: c.prompt[next()][:p.tokens]}
					t0 := time.Now()
					if err := c.r.SelectInto(ctx, &req, &d); err != nil {
						b.Fatal(err)
					}
					if len(samples) < cap(samples) {
						samples = append(samples, time.Since(t0))
					}
					d.PrefillDone()
					d.Done(router.Outcome{})
				}
				cpu1, _ := cputime.Thread()
				reportSelect(b, samples, cpuOK, cpu1-cpu0)
			})
			b.Run(fmt.Sprintf("workers=%d/prompt=%s/dist=%s/parallel", workers, p.name, dist), func(b *testing.B) {
				c := cluster(b, workers)
				var mu sync.Mutex
				var all []time.Duration
				var seed uint64
				b.ReportAllocs()
				b.ResetTimer()
				cpu0, cpuOK := cputime.Process()
				b.RunParallel(func(pb *testing.PB) {
					mu.Lock()
					seed++
					next := chooser(dist, seed)
					mu.Unlock()
					var d router.Decision
					samples := make([]time.Duration, 0, 1<<15)
					for pb.Next() {
						req := router.Request{Tokens: c.prompt[next()][:p.tokens]}
						t0 := time.Now()
						if err := c.r.SelectInto(ctx, &req, &d); err != nil {
							b.Error(err)
							return
						}
						if len(samples) < cap(samples) {
							samples = append(samples, time.Since(t0))
						}
						d.PrefillDone()
						d.Done(router.Outcome{})
					}
					mu.Lock()
					all = append(all, samples...)
					mu.Unlock()
				})
				cpu1, _ := cputime.Process()
				reportSelect(b, all, cpuOK, cpu1-cpu0)
			})
		}
	}
}
