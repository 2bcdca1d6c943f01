package gateway_test

import (
	"context"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/internal/quickack"
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
	delayAcks := func() { // into delayed-acknowledgement mode, as the kernel goes
		t.Helper()
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 0)
		}); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
	}
	buf := make([]byte, 5)
	for i := range 3 {
		delayAcks()
		if _, err := c.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		if armed, err := quickack.Armed(c.(syscall.Conn)); err != nil || !armed {
			t.Fatalf("round %d: TCP_QUICKACK armed %v (%v) after a read, want armed (acknowledge at once)", i, armed, err)
		}
	}
}
