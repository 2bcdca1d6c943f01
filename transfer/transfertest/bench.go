package transfertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/transfer"
)

// Benchmark measures a backend: the throughput of moving 1,000 blocks of
// 64 KiB between two agents with one prepared request (GB/s), and the
// per-transfer cost of moving one small block, reusing a request
// (repost) and building a fresh one each time (create). Run it from a
// backend's benchmark function:
//
//	func BenchmarkTransfer(b *testing.B) { transfertest.Benchmark(b, newAgent) }
func Benchmark(b *testing.B, newAgent Factory) {
	for _, op := range []transfer.Op{transfer.Write, transfer.Read} {
		b.Run(fmt.Sprintf("op=%s/blocks=1000/size=64KiB", op), func(b *testing.B) {
			benchBlocks(b, newAgent, op, 1000, 64<<10, false)
		})
	}
	for _, size := range []int{256, 4 << 10} {
		for _, fresh := range []bool{false, true} {
			mode := "repost"
			if fresh {
				mode = "create"
			}
			b.Run(fmt.Sprintf("op=WRITE/blocks=1/size=%s/%s", sizeName(size), mode), func(b *testing.B) {
				benchBlocks(b, newAgent, transfer.Write, 1, size, fresh)
			})
		}
	}
}

func sizeName(n int) string {
	if n >= 1<<10 && n%(1<<10) == 0 {
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// benchBlocks moves blocks×size bytes per iteration: with one request
// reposted, or with a request created and released each time.
func benchBlocks(b *testing.B, newAgent Factory, op transfer.Op, blocks, size int, fresh bool) {
	a, t := newAgent(b, "bench-initiator"), newAgent(b, "bench-target")
	defer func() {
		_ = a.Close()
		_ = t.Close()
	}()
	total := blocks * size
	ba, bt := alloc(b, total), alloc(b, total)
	must(b, a.RegisterMem(ba.RegList()))
	must(b, t.RegisterMem(bt.RegList()))
	exchange(b, a, t)
	ld := transfer.DescList{Kind: transfer.DRAM}
	rd := transfer.DescList{Kind: transfer.DRAM}
	idx := make([]int, blocks)
	for i := range blocks {
		ld.Descs = append(ld.Descs, ba.Desc(i*size, size))
		// Scatter: the target's blocks in reverse order.
		rd.Descs = append(rd.Descs, bt.Desc((blocks-1-i)*size, size))
		idx[i] = i
	}
	lp, err := a.PrepDescList("", ld)
	must(b, err)
	rp, err := a.PrepDescList(t.Name(), rd)
	must(b, err)
	defer func() {
		_ = lp.Release()
		_ = rp.Release()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	req, err := a.MakeRequest(op, lp, idx, rp, idx, nil)
	must(b, err)
	b.SetBytes(int64(total))
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		if fresh {
			must(b, req.Release())
			req, err = a.MakeRequest(op, lp, idx, rp, idx, nil)
			must(b, err)
		}
		if _, err := req.Post(); err != nil {
			b.Fatal(err)
		}
		if err := req.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	must(b, req.Release())
	b.ReportMetric(float64(total)*float64(b.N)/elapsed.Seconds()/1e9, "GB/s")
	b.ReportMetric(float64(elapsed.Microseconds())/float64(b.N), "µs/transfer")
}
