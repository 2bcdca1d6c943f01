package main

import (
	"flag"
	"runtime"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
)

// BenchmarkReplay replays the default trace workloads (the whole Mooncake
// sample) on a new index per iteration, with room for each worker's cache,
// as the driver's kvroute side does, for profiling the write side without
// the Rust peer.
// replayGC makes BenchmarkReplay collect garbage before each iteration,
// off the clock, as the driver does before each pass.
var replayGC = flag.Bool("replay-gc", false, "BenchmarkReplay: collect garbage before each iteration, off the clock, as the driver does")

func BenchmarkReplay(b *testing.B) {
	for _, c := range []struct {
		name string
		e    eviction
	}{{"lru", evictLRU}, {"random", evictRandom}} {
		b.Run(c.name, func(b *testing.B) {
			tc := defaultTrace(c.e)
			w, err := genTrace(sampleRecords(b, 1<<30), tc)
			if err != nil {
				b.Fatal(err)
			}
			s := &w.Sections[0]
			ops := prepareKV(s)
			var blockOps int64
			for j := range s.Ops {
				blockOps += int64(s.Ops[j].blockOps())
			}
			h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: w.BlockSize})
			var res indexer.MatchResult
			b.ResetTimer()
			cpu0 := processCPU()
			for range b.N {
				if *replayGC {
					b.StopTimer()
					runtime.GC()
					b.StartTimer()
				}
				ix, err := indexer.New(indexer.Config{Hasher: h, WorkerBlocks: tc.Capacity})
				if err != nil {
					b.Fatal(err)
				}
				for j := range ops {
					k := &ops[j]
					switch k.kind {
					case opStored, opRemoved:
						if err := ix.Apply(&k.ev); err != nil {
							b.Fatal(err)
						}
					case opQuery:
						ix.Match(k.seqs, &res)
					}
				}
			}
			cpu := processCPU() - cpu0
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(int64(b.N)*blockOps), "ns/block-op")
			if cpu0 > 0 {
				// The process's CPU time (the garbage collector's
				// included), which other jobs on a busy machine inflate
				// much less than elapsed time.
				b.ReportMetric(float64(cpu)/float64(int64(b.N)*blockOps), "cpu-ns/block-op")
			}
		})
	}
}

// BenchmarkApplyNew times the tree workload's apply section (new blocks
// stored into a built index) at a quarter of its default size; the build
// is untimed.
func BenchmarkApplyNew(b *testing.B) {
	w := genTree(defaultTree().scaled(0.25))
	var build, apply []kvOp
	var blocks int64
	for i := range w.Sections {
		s := &w.Sections[i]
		switch s.Name {
		case secBuild:
			build = prepareKV(s)
		case secApply:
			apply = prepareKV(s)
			for j := range s.Ops {
				blocks += int64(s.Ops[j].blockOps())
			}
		}
	}
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: w.BlockSize})
	var ns, cpu int64
	for range b.N {
		ix, err := indexer.New(indexer.Config{Hasher: h})
		if err != nil {
			b.Fatal(err)
		}
		for j := range build {
			if err := ix.Apply(&build[j].ev); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		start, cpu0 := time.Now(), processCPU()
		for j := range apply {
			if err := ix.Apply(&apply[j].ev); err != nil {
				b.Fatal(err)
			}
		}
		ns += time.Since(start).Nanoseconds()
		cpu += processCPU() - cpu0
	}
	b.ReportMetric(float64(ns)/float64(int64(b.N)*blocks), "ns/block-op")
	if cpu > 0 {
		b.ReportMetric(float64(cpu)/float64(int64(b.N)*blocks), "cpu-ns/block-op")
	}
}
