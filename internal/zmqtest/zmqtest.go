// Package zmqtest provides ZMQ publishing for tests: publishers bound the
// way a data-parallel engine binds them, one per rank on consecutive
// loopback ports, and vLLM-framed batches sent until they are applied.
package zmqtest

import (
	"context"
	"encoding/binary"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/kvevents"
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

// PublishUntil sends payload on s under topic, framed as vLLM's publisher
// frames it (topic, big-endian sequence number, payload) with a new
// sequence number each time, until done reports true or 10 seconds have
// passed, which fails the test. A PUB socket drops what it sends before a
// subscriber has joined, so a test publishes until its batch is applied.
func PublishUntil(t testing.TB, s zmq4.Socket, topic string, payload []byte, done func() bool) {
	t.Helper()
	var seq uint64
	deadline := time.Now().Add(10 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("published %d times on %s, never applied", seq, s.Addr())
		}
		_ = s.Send(zmq4.NewMsgFrom([]byte(topic), binary.BigEndian.AppendUint64(nil, seq), payload))
		seq++
		time.Sleep(20 * time.Millisecond)
	}
}

// RanklessBatch returns a vLLM v0.9-style batch (two elements, no
// data-parallel rank) storing two 16-token blocks, engine hashes 11 and 12.
func RanklessBatch(t testing.TB) []byte {
	t.Helper()
	tokens := make([]uint32, 32)
	for i := range tokens {
		tokens[i] = uint32(100 + i)
	}
	payload, err := kvevents.AppendBatch(nil, &kvevents.Batch{Timestamp: 1, Events: []kvevents.EngineEvent{{
		Type: kvevents.BlockStored, Fields: kvevents.StoredFieldsV09,
		BlockHashes: []kvevents.Hash{kvevents.UintHash(11), kvevents.UintHash(12)},
		TokenIDs:    tokens, BlockSize: 16,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return payload
}

// SilentPeer returns a loopback tcp:// endpoint whose listener accepts
// connections and never speaks, as the kernel of a frozen engine process
// does; serve, when not nil, is given each connection (to write something
// other than ZMTP, say). Everything is closed when the test ends.
func SilentPeer(t testing.TB, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			if serve != nil {
				go serve(c)
			}
		}
	}()
	return "tcp://" + ln.Addr().String()
}
