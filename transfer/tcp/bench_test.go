package tcp_test

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/cputime"
	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/transfertest"
)

func BenchmarkTransfer(b *testing.B) {
	transfertest.Benchmark(b, newAgent)
}

// BenchmarkIOCopy is the baseline: 1,000 × 64 KiB moved with io.Copy over
// one loopback TCP connection into a receiving buffer.
func BenchmarkIOCopy(b *testing.B) {
	const total = 1000 * 64 << 10
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		dst := make([]byte, total)
		for {
			if _, err := io.ReadFull(c, dst); err != nil {
				got <- err
				return
			}
			got <- nil
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	src := make([]byte, total)
	b.SetBytes(total)
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		if _, err := io.Copy(c, &sliceReader{b: src}); err != nil {
			b.Fatal(err)
		}
		if err := <-got; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(total)*float64(b.N)/time.Since(start).Seconds()/1e9, "GB/s")
}

// sliceReader is a bytes.Reader without WriterTo, so io.Copy goes through
// the connection's ReadFrom (splice is not possible from memory) exactly as
// a user's io.Copy of a buffer would.
type sliceReader struct{ b []byte }

func (r *sliceReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// BenchmarkRegionLookup measures the check that descriptors lie in
// registered memory when an agent holds many registrations: the agent
// registers regions of 4 KiB each, a peer loads its metadata, and each
// iteration prepares a list of 256 descriptors spread over all the
// regions, against the agent's own registrations (side=local, the check
// the target also makes on every request it serves) or the loaded
// metadata (side=remote). ns/desc is the cost of one descriptor's check;
// on Linux cpu-ns/desc is the CPU time of the benchmark's thread per
// descriptor, which other work on the machine disturbs less.
func BenchmarkRegionLookup(b *testing.B) {
	const (
		regionSize = 4 << 10
		listLen    = 256
	)
	for _, n := range []int{1, 64, 4096} {
		buf, err := transfer.AllocBuffer(n * regionSize)
		if err != nil {
			b.Fatal(err)
		}
		defer buf.Free()
		owner, peer := newAgent(b, "owner"), newAgent(b, "peer")
		defer owner.Close()
		defer peer.Close()
		regs := make([]transfer.RegDesc, n)
		// Registered in a scattered order, as memory comes and goes.
		for i := range regs {
			regs[i] = transfer.RegDesc{Desc: buf.Desc((i*2477)%n*regionSize, regionSize)}
		}
		if err := owner.RegisterMem(transfer.RegList{Kind: transfer.DRAM, Descs: regs}); err != nil {
			b.Fatal(err)
		}
		md, err := owner.LocalMetadata()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := peer.LoadRemoteMetadata(md); err != nil {
			b.Fatal(err)
		}
		list := transfer.DescList{Kind: transfer.DRAM, Descs: make([]transfer.Desc, listLen)}
		for i := range list.Descs {
			region := (i * 7919) % n
			list.Descs[i] = buf.Desc(region*regionSize+i%8*64, 512)
		}
		for _, side := range []struct {
			name   string
			agent  transfer.Agent
			remote string
		}{{"local", owner, ""}, {"remote", peer, "owner"}} {
			b.Run(fmt.Sprintf("regions=%d/side=%s", n, side.name), func(b *testing.B) {
				b.ReportAllocs()
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				cpu0, cpuOK := cputime.Thread()
				start := time.Now()
				for b.Loop() {
					l, err := side.agent.PrepDescList(side.remote, list)
					if err != nil {
						b.Fatal(err)
					}
					if err := l.Release(); err != nil {
						b.Fatal(err)
					}
				}
				descs := float64(b.N * listLen)
				b.ReportMetric(float64(time.Since(start).Nanoseconds())/descs, "ns/desc")
				if cpu1, ok := cputime.Thread(); ok && cpuOK {
					b.ReportMetric(float64(cpu1-cpu0)/descs, "cpu-ns/desc")
				}
			})
		}
	}
}
