// Package zmqtest provides ZMQ sockets for tests: publishers bound the way
// a data-parallel engine binds them, one per rank on consecutive loopback
// ports.
package zmqtest

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/go-zeromq/zmq4"
)

// RankPublishers binds n ZMQ PUB sockets on consecutive loopback ports, as
// an engine with n data-parallel ranks does, and returns them with the
// endpoint of rank 0. It tries 20 first ports before it fails the test;
// the sockets are closed when the test ends.
func RankPublishers(t testing.TB, n int) ([]zmq4.Socket, string) {
	t.Helper()
	for range 20 {
		first := zmq4.NewPub(context.Background())
		if err := first.Listen("tcp://127.0.0.1:0"); err != nil {
			first.Close()
			t.Fatal(err)
		}
		addr := first.Addr().String()
		port, err := strconv.Atoi(addr[strings.LastIndexByte(addr, ':')+1:])
		if err != nil {
			first.Close()
			t.Fatalf("port of %s: %v", addr, err)
		}
		socks := []zmq4.Socket{first}
		for r := 1; r < n; r++ {
			s := zmq4.NewPub(context.Background())
			if err := s.Listen("tcp://127.0.0.1:" + strconv.Itoa(port+r)); err != nil {
				s.Close()
				break
			}
			socks = append(socks, s)
		}
		if len(socks) == n {
			t.Cleanup(func() {
				for _, s := range socks {
					s.Close()
				}
			})
			return socks, "tcp://" + addr
		}
		for _, s := range socks {
			s.Close()
		}
	}
	t.Fatalf("no %d consecutive free loopback ports", n)
	return nil, ""
}
