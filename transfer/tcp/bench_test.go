package tcp_test

import (
	"io"
	"net"
	"testing"
	"time"

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
