package kvroute_test

import (
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute"
)

// benchTokens returns n token ids that look like a real vocabulary.
func benchTokens(n int) []uint32 {
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(i*2654435761) % 151936
	}
	return toks
}

// bareBlockHashes is the floor the hasher is measured against: one XXH3
// call per block over bytes already in little-endian form, no conversion
// and no chaining.
func bareBlockHashes(raw []byte, blockBytes int, seed uint64) uint64 {
	var acc uint64
	for i := 0; i+blockBytes <= len(raw); i += blockBytes {
		acc ^= xxh3.HashSeed(raw[i:i+blockBytes], seed)
	}
	return acc
}

var sink uint64

// BenchmarkHash compares chained hashing of 4,096 tokens (block size 16)
// with bare per-block XXH3 calls over the same bytes. The ratio
// sub-benchmark times both in one loop and reports chained/bare; the
// target is at most 1.6.
func BenchmarkHash(b *testing.B) {
	const n, bs = 4096, 16
	toks := benchTokens(n)
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&toks[0])), n*4)
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: bs})
	seqs := make([]kvroute.SeqHash, 0, n/bs)

	b.Run("tokens=4096/bare", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			sink ^= bareBlockHashes(raw, bs*4, h.Seed())
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n/bs), "ns/block")
	})
	b.Run("tokens=4096/chained", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			seqs = h.AppendSeqHashes(seqs[:0], toks)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n/bs), "ns/block")
	})
	b.Run("tokens=4096/salted", func(b *testing.B) {
		hs := h.WithSalt("tenant-a")
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			seqs = hs.AppendSeqHashes(seqs[:0], toks)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n/bs), "ns/block")
	})
	b.Run("tokens=4096/mm", func(b *testing.B) {
		// Two images of 576 placeholder tokens each.
		mm := []kvroute.MMObject{{Hash: 1, Offset: 100, Length: 576}, {Hash: 2, Offset: 2000, Length: 576}}
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			seqs = h.AppendSeqHashesMM(seqs[:0], toks, mm)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n/bs), "ns/block")
	})
	b.Run("tokens=4096/ratio", func(b *testing.B) {
		b.ReportAllocs()
		var bare, chained time.Duration
		for b.Loop() {
			t0 := time.Now()
			for range 16 {
				sink ^= bareBlockHashes(raw, bs*4, h.Seed())
			}
			t1 := time.Now()
			for range 16 {
				seqs = h.AppendSeqHashes(seqs[:0], toks)
			}
			bare += t1.Sub(t0)
			chained += time.Since(t1)
		}
		b.ReportMetric(float64(chained)/float64(bare), "chained/bare")
	})
}

// BenchmarkHashMMItems hashes a 128k-token prompt with more and more
// multimodal items (video frames, say), evenly spread and each covering
// half of its share of the prompt: the cost should follow the blocks and
// the blocks each item covers, not blocks times items.
func BenchmarkHashMMItems(b *testing.B) {
	const n = 128 << 10
	toks := benchTokens(n)
	h := kvroute.MustHasher(kvroute.HasherConfig{})
	seqs := make([]kvroute.SeqHash, 0, n/h.BlockSize())
	for _, items := range []int{2, 100, 1000} {
		mm := make([]kvroute.MMObject, items)
		for i := range mm {
			mm[i] = kvroute.MMObject{Hash: uint64(i + 1), Offset: i * (n / items), Length: n / items / 2}
		}
		b.Run(fmt.Sprintf("tokens=128k/items=%d", items), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				seqs = h.AppendSeqHashesMM(seqs[:0], toks, mm)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n/h.BlockSize()), "ns/block")
		})
	}
}
