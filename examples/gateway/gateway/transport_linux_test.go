package gateway_test

import (
	"context"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/kvroute/kvroute/examples/gateway/gateway"
)

// TestNewTransportAcknowledgesAtOnce checks that the default transport's
// connections leave Linux's delayed-acknowledgement mode after every
// read, so that an engine with Nagle's algorithm on cannot hold back the
// first chunk of a stream (see internal/quickack's BenchmarkNagleServer).
func TestNewTransportAcknowledgesAtOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		s, err := ln.Accept()
		if err != nil {
			return
		}
		defer s.Close()
		buf := make([]byte, 1)
		for {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			if _, err := s.Write([]byte("chunk")); err != nil {
				return
			}
		}
	}()
	c, err := gateway.NewTransport().DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	quickAck := func(set int) (got int) {
		t.Helper()
		var serr error
		if err := raw.Control(func(fd uintptr) {
			if set >= 0 {
				serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, set)
				return
			}
			got, serr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK)
		}); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		return got
	}
	buf := make([]byte, 5)
	for i := range 3 {
		quickAck(0) // into delayed-acknowledgement mode, as the kernel goes
		if _, err := c.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		if got := quickAck(-1); got != 1 {
			t.Fatalf("round %d: TCP_QUICKACK = %d after a read, want 1 (acknowledge at once)", i, got)
		}
	}
}
