package quickack

import (
	"io"
	"net"
	"testing"
	"time"
)

// BenchmarkNagleServer times answers from a server that leaves Nagle's
// algorithm on and writes each answer as a small head, then after
// headDelay a small first chunk, as a streaming HTTP server writes its
// response headers and first event. On a kept-alive connection a plain
// client receives the chunk only when its delayed acknowledgement of the
// head goes out (up to 40 ms); a wrapped one after headDelay.
func BenchmarkNagleServer(b *testing.B) {
	const headDelay = 2 * time.Millisecond
	for _, tc := range []struct {
		name string
		wrap func(net.Conn) net.Conn
	}{
		{"plain", func(c net.Conn) net.Conn { return c }},
		{"quickack", Wrap},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c, s := pair(b)
			if err := s.SetNoDelay(false); err != nil {
				b.Fatal(err)
			}
			go func() {
				req := make([]byte, 1)
				for {
					if _, err := io.ReadFull(s, req); err != nil {
						return
					}
					if _, err := s.Write([]byte("head")); err != nil {
						return
					}
					time.Sleep(headDelay)
					if _, err := s.Write([]byte("data")); err != nil {
						return
					}
				}
			}()
			w := tc.wrap(c)
			answer := make([]byte, 8)
			var total time.Duration
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				if _, err := w.Write([]byte("q")); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(w, answer); err != nil {
					b.Fatal(err)
				}
				total += time.Since(start)
			}
			b.ReportMetric(float64(total.Microseconds())/1e3/float64(b.N), "ms/answer")
		})
	}
}
