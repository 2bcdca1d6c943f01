package indexer_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
)

// Benchmark index shape: 1,024 distinct chains of 1,024 blocks (1M blocks,
// block size 16, so every chain is a 16K-token prompt), each held by all 8
// workers: 8M (block, worker) pairs. A 1K-token request is the first 64
// blocks of a chain.
const (
	benchChains  = 1024
	benchDepth   = 1024
	benchWorkers = 8
	benchBlock   = 16
)

var benchHasher = kvroute.MustHasher(kvroute.HasherConfig{BlockSize: benchBlock})

type benchIndex struct {
	ix     *indexer.Index
	prompt [][]kvroute.SeqHash // per chain, all its sequence hashes
	heap   uint64              // live heap the index added
	build  float64             // seconds to build
}

var (
	bigOnce sync.Once
	big     *benchIndex
)

// chainBlocks returns the block hashes of chain c.
func chainBlocks(c int) []kvroute.BlockHash {
	toks := make([]uint32, benchDepth*benchBlock)
	r := rand.New(rand.NewPCG(uint64(c), 1))
	for i := range toks {
		toks[i] = uint32(r.IntN(151936))
	}
	return benchHasher.AppendBlockHashes(nil, toks)
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// buildIndex applies Stored events for chains×depth blocks; holders says
// which workers hold chain c.
func buildIndex(tb testing.TB, chains, depth int, holders func(c int) []int) *benchIndex {
	before := heapInUse()
	ix, err := indexer.New(indexer.Config{Hasher: benchHasher, SizeHint: chains * depth})
	if err != nil {
		tb.Fatal(err)
	}
	bi := &benchIndex{ix: ix}
	ev := kvroute.Event{Kind: kvroute.EventStored}
	ev.Blocks = make([]kvroute.StoredBlock, 64)
	for c := range chains {
		locals := chainBlocks(c)[:depth]
		bi.prompt = append(bi.prompt, kvroute.ChainSeqHashes(nil, 0, false, locals))
		for _, w := range holders(c) {
			ev.Worker = kvroute.WorkerKey{ID: kvroute.WorkerID(w)}
			for start := 0; start < depth; start += 64 {
				ev.HasParent = start > 0
				ev.Parent = kvroute.ExternalHash(c<<20 | (start - 1))
				ev.Blocks = ev.Blocks[:0]
				for i := start; i < start+64 && i < depth; i++ {
					ev.Blocks = append(ev.Blocks, kvroute.StoredBlock{External: kvroute.ExternalHash(c<<20 | i), Hash: locals[i]})
				}
				if err := ix.Apply(&ev); err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
	bi.heap = heapInUse() - before
	return bi
}

func allWorkers(int) []int {
	ws := make([]int, benchWorkers)
	for i := range ws {
		ws[i] = i
	}
	return ws
}

func bigIndex(b *testing.B) *benchIndex {
	bigOnce.Do(func() { big = buildIndex(b, benchChains, benchDepth, allWorkers) })
	return big
}

// BenchmarkMatch matches 1K- and 16K-token prompts against the 1M-block,
// 8-worker index. hot repeats one prompt; cold walks all 1,024 chains in a
// shuffled order, so most lookups miss the CPU caches.
func BenchmarkMatch(b *testing.B) {
	bi := bigIndex(b)
	for _, p := range []struct {
		name   string
		blocks int
	}{{"prompt=1k", 64}, {"prompt=16k", 1024}} {
		for _, mode := range []string{"hot", "cold"} {
			b.Run(fmt.Sprintf("workers=8/%s/%s", p.name, mode), func(b *testing.B) {
				order := rand.New(rand.NewPCG(7, 7)).Perm(benchChains)
				var res indexer.MatchResult
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					c := 0
					if mode == "cold" {
						c = order[i%len(order)]
					}
					bi.ix.Match(bi.prompt[c][:p.blocks], &res)
					i++
				}
				if res.Blocks != p.blocks || len(res.Workers) != benchWorkers {
					b.Fatalf("matched %d blocks on %d workers", res.Blocks, len(res.Workers))
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "matches/s")
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*p.blocks), "ns/block")
			})
			b.Run(fmt.Sprintf("workers=8/%s/%s/parallel", p.name, mode), func(b *testing.B) {
				b.ReportAllocs()
				var seed uint64
				var mu sync.Mutex
				b.RunParallel(func(pb *testing.PB) {
					mu.Lock()
					seed++
					r := rand.New(rand.NewPCG(seed, 3))
					mu.Unlock()
					var res indexer.MatchResult
					for pb.Next() {
						c := 0
						if mode == "cold" {
							c = r.IntN(benchChains)
						}
						bi.ix.Match(bi.prompt[c][:p.blocks], &res)
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "matches/s")
				// The latency of one call on each of the GOMAXPROCS
				// goroutines, to compare with the single-goroutine ns/op.
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())*float64(runtime.GOMAXPROCS(0))/float64(b.N), "ns/call")
			})
		}
	}
}

// BenchmarkApply measures event ingest: Stored events of 16 blocks chained
// under a parent, for 8 workers, with Removed events keeping the index at
// about 64K blocks per worker.
func BenchmarkApply(b *testing.B) {
	for _, blocks := range []int{1, 16} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			ix, err := indexer.New(indexer.Config{Hasher: benchHasher})
			if err != nil {
				b.Fatal(err)
			}
			locals := chainBlocks(0)
			const window = 1 << 16
			stored := kvroute.Event{Kind: kvroute.EventStored, Blocks: make([]kvroute.StoredBlock, blocks)}
			removed := kvroute.Event{Kind: kvroute.EventRemoved, Removed: make([]kvroute.ExternalHash, blocks)}
			ids := make([]uint64, benchWorkers)
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				w := n % benchWorkers
				round := n / benchWorkers
				base := round * blocks
				stored.Worker = kvroute.WorkerKey{ID: kvroute.WorkerID(w)}
				ids[w]++
				stored.ID = ids[w]
				// Each round starts a new root so the tree keeps a steady shape.
				stored.HasParent = false
				for i := range stored.Blocks {
					stored.Blocks[i] = kvroute.StoredBlock{External: kvroute.ExternalHash(base + i), Hash: locals[(base+i)%len(locals)] ^ kvroute.BlockHash(round)}
				}
				if err := ix.Apply(&stored); err != nil {
					b.Fatal(err)
				}
				if old := base - window; old >= 0 {
					removed.Worker = stored.Worker
					ids[w]++
					removed.ID = ids[w]
					for i := range removed.Removed {
						removed.Removed[i] = kvroute.ExternalHash(old + i)
					}
					if err := ix.Apply(&removed); err != nil {
						b.Fatal(err)
					}
				}
				n++
			}
			b.ReportMetric(float64(b.N*blocks)/b.Elapsed().Seconds(), "blocks/s")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
		})
	}
}

// BenchmarkMemory reports the live heap per (block, worker) pair for two
// shapes of 1M blocks and 8 workers: every block held by all workers (8M
// pairs), and every block held by one worker (1M pairs).
func BenchmarkMemory(b *testing.B) {
	for _, shape := range []struct {
		name    string
		holders func(int) []int
	}{
		{"blocks=1M/workers=8/shared", allWorkers},
		{"blocks=1M/workers=8/disjoint", func(c int) []int { return []int{c % benchWorkers} }},
	} {
		b.Run(shape.name, func(b *testing.B) {
			var bi *benchIndex
			for b.Loop() {
				bi = buildIndex(b, benchChains, benchDepth, shape.holders)
			}
			size := bi.ix.Size()
			b.ReportMetric(float64(bi.heap)/float64(size.Pairs), "bytes/pair")
			b.ReportMetric(float64(size.Bytes)/float64(size.Pairs), "est-bytes/pair")
			b.ReportMetric(float64(size.Pairs*bi.ix.Size().Blocks/size.Blocks)/b.Elapsed().Seconds()*float64(b.N), "pairs/s")
			runtime.KeepAlive(bi)
		})
	}
}
