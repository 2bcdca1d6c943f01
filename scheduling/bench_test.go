package scheduling_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

// benchCandidates returns n candidates with varied cache depth and load for
// a prompt of promptBlocks blocks.
func benchCandidates(n, promptBlocks int) []scheduling.Candidate {
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	now := time.Now()
	cands := make([]scheduling.Candidate, n)
	for i := range cands {
		dev := rng.IntN(promptBlocks + 1)
		host := rng.IntN(promptBlocks - dev + 1)
		cands[i] = scheduling.Candidate{
			Worker: kvroute.WorkerKey{ID: kvroute.WorkerID(i + 1)},
			Cached: [kvroute.NumTiers]int{dev, host},
			Load: scheduling.Load{
				ActivePrefillTokens:   rng.IntN(16384),
				ActiveDecodeBlocks:    rng.IntN(4096),
				PotentialDecodeBlocks: rng.IntN(4096) + promptBlocks,
				ActiveRequests:        rng.IntN(64),
				MaxRequests:           64,
				KVUtilization:         rng.Float64(),
			},
			LastUpdate: now.Add(-time.Duration(rng.IntN(3000)) * time.Millisecond),
		}
	}
	return cands
}

// idleCandidates returns n idle candidates for a prompt of promptBlocks
// blocks, two of which hold all of it: a steady stream's pool between
// requests, as router's BenchmarkSelect meets it.
func idleCandidates(n, promptBlocks int) []scheduling.Candidate {
	cands := make([]scheduling.Candidate, n)
	for i := range cands {
		cands[i] = scheduling.Candidate{
			Worker: kvroute.WorkerKey{ID: kvroute.WorkerID(i + 1)},
			Load:   scheduling.Load{PotentialDecodeBlocks: promptBlocks, MaxRequests: 256, MaxBatchedTokens: 8192},
		}
	}
	for _, i := range []int{n / 3, n/3 + 1} {
		cands[i%n].Cached[kvroute.TierDevice] = promptBlocks
	}
	return cands
}

// BenchmarkChoose scores and chooses among candidates of varied cache and
// load, and (pool=idle) among idle ones two of which hold the prompt.
func BenchmarkChoose(b *testing.B) {
	dynamo, _ := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{})
	weighted, _ := scheduling.NewWeightedScore(scheduling.WeightedScoreConfig{})
	stale, _ := scheduling.NewStalenessCost(dynamo, scheduling.StalenessConfig{})
	def, _ := scheduling.NewDefaultCost(16)
	costs := []struct {
		name string
		cost scheduling.CostFunc
	}{
		{"dynamo", dynamo}, {"weighted", weighted}, {"staleness", stale},
		// Choose's one-pass path for the default cost, and the same cost
		// through the generic path (Costs, then Select).
		{"default", def}, {"default-generic", scheduling.CostFuncFunc(def.Costs)},
	}
	for _, cf := range costs {
		for _, temp := range []float64{0, 0.5} {
			for _, n := range []int{8, 64, 512} {
				for _, idle := range []bool{false, true} {
					name := fmt.Sprintf("cost=%s/temp=%g/workers=%d/prompt=1k", cf.name, temp, n)
					if idle {
						name += "/pool=idle"
					}
					b.Run(name, func(b *testing.B) {
						sel, _ := scheduling.NewSelector(scheduling.SelectorConfig{Temperature: temp, Seed: 1})
						cands := benchCandidates(n, 64)
						if idle {
							cands = idleCandidates(n, 64)
						}
						out := make([]float64, n)
						req := scheduling.Request{PromptTokens: 1024, Blocks: 64, BlockSize: 16}
						b.ReportAllocs()
						for b.Loop() {
							if _, err := scheduling.Choose(cf.cost, sel, &req, cands, out); err != nil {
								b.Fatal(err)
							}
						}
						b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
						b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/candidate")
					})
				}
			}
		}
	}
}

func BenchmarkSelectParallel(b *testing.B) {
	for _, n := range []int{8, 64, 512} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			sel, _ := scheduling.NewSelector(scheduling.SelectorConfig{Seed: 1})
			costs := make([]float64, n)
			for i := range costs {
				costs[i] = float64(i % 4) // n/4 exact ties at the minimum
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					sel.Select(costs, scheduling.OptFloat{})
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

func BenchmarkTrackerAddFree(b *testing.B) {
	for _, workers := range []int{8, 64} {
		b.Run(fmt.Sprintf("workers=%d/prompt=1k", workers), func(b *testing.B) {
			tr, _ := scheduling.NewTracker(scheduling.TrackerConfig{BlockSize: 16})
			// 32 prompt families share a 48-block prefix; each request adds
			// 16 private blocks, as chats behind shared system prompts do.
			var next atomic.Uint64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				blocks := make([]kvroute.SeqHash, 64)
				for pb.Next() {
					id := next.Add(1)
					fam := id % 32
					for i := range blocks {
						if i < 48 {
							blocks[i] = kvroute.SeqHash(fam<<32 | uint64(i))
						} else {
							blocks[i] = kvroute.SeqHash(id<<40 | uint64(i))
						}
					}
					w := kvroute.WorkerKey{ID: kvroute.WorkerID(id % uint64(workers))}
					if err := tr.Add(scheduling.RequestID(id), w, blocks, 1024); err != nil {
						b.Fatal(err)
					}
					tr.PrefillDone(scheduling.RequestID(id))
					tr.Free(scheduling.RequestID(id))
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
		})
	}
}

func BenchmarkTrackerFillLoad(b *testing.B) {
	for _, workers := range []int{8, 64, 512} {
		for _, hint := range []bool{true, false} {
			b.Run(fmt.Sprintf("workers=%d/prompt=1k/cached=%v", workers, hint), func(b *testing.B) {
				tr, _ := scheduling.NewTracker(scheduling.TrackerConfig{BlockSize: 16})
				// 16 active requests per worker from 8 prompt families.
				id := scheduling.RequestID(0)
				blocks := make([]kvroute.SeqHash, 64)
				for w := range workers {
					for r := range 16 {
						id++
						for i := range blocks {
							blocks[i] = kvroute.SeqHash(uint64(r%8)<<32 | uint64(i))
							if i >= 32 {
								blocks[i] |= kvroute.SeqHash(uint64(id) << 40)
							}
						}
						_ = tr.Add(id, kvroute.WorkerKey{ID: kvroute.WorkerID(w)}, blocks, 512)
					}
				}
				// The routed prompt shares 40 blocks with family 3.
				query := make([]kvroute.SeqHash, 64)
				for i := range query {
					query[i] = kvroute.SeqHash(3<<32 | uint64(i))
					if i >= 40 {
						query[i] |= 1 << 63
					}
				}
				cands := make([]scheduling.Candidate, workers)
				for i := range cands {
					cands[i].Worker = kvroute.WorkerKey{ID: kvroute.WorkerID(i)}
					if hint { // the index reports the shared prefix as cached
						cands[i].Cached[kvroute.TierDevice] = 40
					}
				}
				b.ReportAllocs()
				for b.Loop() {
					for i := range cands {
						tr.FillLoad(&cands[i], query)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(workers), "ns/worker")
			})
		}
	}
}

func BenchmarkQueueWait(b *testing.B) {
	for _, waiting := range []int{0, 1000} {
		for _, policy := range []scheduling.Policy{scheduling.FCFS, scheduling.WSPT} {
			b.Run(fmt.Sprintf("policy=%s/waiting=%d", policy, waiting), func(b *testing.B) {
				q, _ := scheduling.NewQueue(scheduling.QueueConfig{Policy: policy, Capacity: waiting + 1024})
				// Background requests of a lower class wait throughout; each
				// measured arrival, of a higher class, is pushed onto the heap
				// and popped again as the best waiter (or, with nobody
				// waiting, takes the lock-free fast path).
				ctx, cancel := context.WithCancel(context.Background())
				var bg sync.WaitGroup
				for i := range waiting {
					bg.Go(func() { _ = q.Wait(ctx, scheduling.Item{NewTokens: i + 1}, true) })
				}
				for q.Len() < waiting {
					time.Sleep(time.Millisecond)
				}
				b.ResetTimer()
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					var i int
					for pb.Next() {
						i++
						if err := q.Wait(ctx, scheduling.Item{Priority: 1, NewTokens: i}, false); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "admissions/s")
				b.StopTimer()
				cancel()
				bg.Wait()
			})
		}
	}
}
