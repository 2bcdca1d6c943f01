package main

import (
	"flag"
	"runtime"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
)

// replayGC makes BenchmarkReplay collect garbage before each replay, the
// warming half included, off the clock, as the driver does before each
// section.
var replayGC = flag.Bool("replay-gc", false, "BenchmarkReplay: collect garbage before each replay, off the clock, as the driver does")

// BenchmarkReplay replays the default trace workloads (the whole Mooncake
// sample) on a new index per iteration, with room for each worker's cache,
// as the driver's kvroute side does, for profiling the write side without
// the Rust peer. The steady variants are the driver's warm workloads: the
// first half of the replay warms the index off the clock, and the second
// half, with every cache full, is timed.
func BenchmarkReplay(b *testing.B) {
	for _, c := range []struct {
		name string
		e    eviction
		warm bool
	}{{"lru", evictLRU, false}, {"random", evictRandom, false}, {"lru-steady", evictLRU, true}, {"random-steady", evictRandom, true}} {
		b.Run(c.name, func(b *testing.B) {
			tc := defaultTrace(c.e)
			if c.warm {
				tc.Warm = warmShare
			}
			w, err := genTrace(sampleRecords(b, 1<<30), tc)
			if err != nil {
				b.Fatal(err)
			}
			var warm []kvOp
			timed := &w.Sections[0]
			if c.warm {
				warm, timed = prepareKV(&w.Sections[0]), &w.Sections[1]
			}
			ops := prepareKV(timed)
			var blockOps int64
			for j := range timed.Ops {
				blockOps += int64(timed.Ops[j].blockOps())
			}
			h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: w.BlockSize})
			var res indexer.MatchResult
			replay := func(ix *indexer.Index, ops []kvOp) {
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
			var cpu int64
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				ix, err := indexer.New(indexer.Config{Hasher: h, WorkerBlocks: tc.Capacity})
				if err != nil {
					b.Fatal(err)
				}
				if *replayGC && c.warm {
					runtime.GC()
				}
				replay(ix, warm)
				if *replayGC {
					runtime.GC()
				}
				cpu0 := processCPU()
				b.StartTimer()
				replay(ix, ops)
				b.StopTimer()
				cpu += processCPU() - cpu0
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(int64(b.N)*blockOps), "ns/block-op")
			if cpu > 0 {
				// The process's CPU time over the timed replays (the
				// garbage collector's included), which other jobs on a
				// busy machine inflate much less than elapsed time.
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
