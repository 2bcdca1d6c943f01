package kvevents_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/internal/cputime"
	"github.com/kvroute/kvroute/kvevents"
)

// ingestPayloads builds a ring of batches, each removing one chain of
// blocks and storing it again, so that the index stays at chains*blocks
// blocks while every batch does real work.
func ingestPayloads(b *testing.B, layout kvevents.EventLayout, chains, blocks int) [][]byte {
	const bs = 16
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([][]byte, chains)
	for c := range out {
		hashes := make([]kvevents.Hash, blocks)
		for i := range hashes {
			hashes[i] = kvevents.UintHash(rng.Uint64())
		}
		tokens := make([]uint32, blocks*bs)
		for i := range tokens {
			tokens[i] = rng.Uint32N(128256)
		}
		batch := kvevents.Batch{Timestamp: 1757500000, RankSlot: true, DPRank: kvevents.Some(0), Events: []kvevents.EngineEvent{
			{Type: kvevents.BlockRemoved, Layout: layout, BlockHashes: hashes, Medium: "GPU", GroupIdx: kvevents.Some(0)},
			{Type: kvevents.BlockStored, Layout: layout, BlockHashes: hashes, TokenIDs: tokens, BlockSize: bs,
				Medium: "GPU", GroupIdx: kvevents.Some(0), SpecKind: "full_attention"},
		}}
		p, err := kvevents.AppendBatch(nil, &batch)
		if err != nil {
			b.Fatal(err)
		}
		out[c] = p
	}
	return out
}

// BenchmarkIngest measures the event ingest path on one goroutine: decode,
// decode+convert (hashing every block's tokens), and decode+convert+apply
// to the indexer. blocks/s counts stored blocks (each batch also removes
// as many).
//
// Besides the wall-clock blocks/s and ns/block it reports cpu-ns/block and
// blocks/cpu-s (Linux): the CPU time of the benchmark's thread, which it
// holds for the loop. On a shared machine other processes take turns on
// the core and inflate wall-clock time; the thread's CPU time is the cost
// of the work on one core (cache interference from the neighbours aside).
func BenchmarkIngest(b *testing.B) {
	const chains, blocks = 256, 64
	for _, layout := range []struct {
		name string
		l    kvevents.EventLayout
	}{{"map", kvevents.LayoutMap}, {"array", kvevents.LayoutArray}} {
		payloads := ingestPayloads(b, layout.l, chains, blocks)
		for _, stage := range []string{"decode", "convert", "apply"} {
			b.Run(fmt.Sprintf("stage=%s/layout=%s/blocks=%d", stage, layout.name, blocks), func(b *testing.B) {
				conv, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 1})
				if err != nil {
					b.Fatal(err)
				}
				ix, err := indexer.New(indexer.Config{SizeHint: chains * blocks})
				if err != nil {
					b.Fatal(err)
				}
				var batch kvevents.Batch
				var evs []kvroute.Event
				var id uint64
				var bytes int
				for _, p := range payloads {
					bytes += len(p)
				}
				b.SetBytes(int64(bytes / len(payloads)))
				b.ReportAllocs()
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				cpu0, cpuOK := cputime.Thread()
				i := 0
				for b.Loop() {
					p := payloads[i%len(payloads)]
					i++
					if err := kvevents.DecodeBatch(p, &batch); err != nil {
						b.Fatal(err)
					}
					if stage == "decode" {
						continue
					}
					if evs, err = conv.Convert(evs[:0], &batch); err != nil {
						b.Fatal(err)
					}
					if stage == "convert" {
						continue
					}
					for j := range evs {
						id++
						evs[j].ID = id
						if err := ix.Apply(&evs[j]); err != nil {
							b.Fatal(err)
						}
					}
				}
				cpu1, _ := cputime.Thread()
				perOp := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(float64(blocks)/perOp, "blocks/s")
				b.ReportMetric(perOp*1e9/float64(blocks), "ns/block")
				if cpuOK && cpu1 > cpu0 { // none measured in a run too short for its resolution
					cpuPerBlock := float64(cpu1-cpu0) / float64(b.N*blocks)
					b.ReportMetric(cpuPerBlock, "cpu-ns/block")
					b.ReportMetric(1e9/cpuPerBlock, "blocks/cpu-s")
				}
			})
		}
	}
}

// BenchmarkParseExtraKeys reads the extra_keys of a 64-block root event
// with a LoRA adapter, a cache salt and an image over blocks 2 to 40, in
// vLLM's layouts from 0.19 on ([identifier, offset] pairs) and before
// (bare identifiers). cpu-ns/op (Linux) is the CPU time of the
// benchmark's thread, as in BenchmarkIngest.
func BenchmarkParseExtraKeys(b *testing.B) {
	const blocks = 64
	id := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, layout := range []string{"pairs", "bare"} {
		keys := make([][]any, blocks)
		for i := range keys {
			keys[i] = []any{"adapter-a"}
			if i >= 2 && i <= 40 {
				if layout == "pairs" {
					keys[i] = append(keys[i], []any{id, 32 - 16*i})
				} else {
					keys[i] = append(keys[i], id)
				}
			}
		}
		keys[0] = append(keys[0], "tenant-a")
		raw := extraKeys(keys...)
		b.Run("layout="+layout, func(b *testing.B) {
			var x kvevents.ExtraKeys
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0, cpuOK := cputime.Thread()
			for b.Loop() {
				if err := kvevents.ParseExtraKeys(raw, "adapter-a", true, &x); err != nil {
					b.Fatal(err)
				}
			}
			if cpu1, _ := cputime.Thread(); cpuOK {
				b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
			}
			if x.Salt != "tenant-a" {
				b.Fatalf("salt %q", x.Salt)
			}
		})
	}
}
