package dynamo

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute/kvevents"
)

// QueryAnswer is what a QueryServer answers one query with: a response
// (Kind "TreeDump" or "Events"), or Hang to accept the request and never
// answer it.
type QueryAnswer struct {
	Hang        bool
	Kind        string
	Events      []kvevents.DynamoEvent
	LastEventID uint64
	// ResetScope is the answer's reset_scope; empty means "all".
	ResetScope string
}

// QueryServer serves worker KV queries on Dynamo's TCP request plane, as
// a worker's local indexer does: it reads the request, acknowledges it,
// connects back to the callback address and streams the handshake, the
// prologue, the response and the final marker (the format of
// queryStreamTreeDump).
type QueryServer struct {
	ln     net.Listener
	answer func(n int, start *uint64) QueryAnswer

	mu      sync.Mutex
	n       int
	started chan int // receives n when the n-th query arrives
	conns   []net.Conn
}

// NewQueryServer serves queries on 127.0.0.1 until the test ends; answer
// gives the answer to the n-th query (from 1) asking from start (nil: a
// dump).
func NewQueryServer(t *testing.T, answer func(n int, start *uint64) QueryAnswer) *QueryServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &QueryServer{ln: ln, answer: answer, started: make(chan int, 64)}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			wg.Go(func() { s.serve(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		wg.Wait()
	})
	return s
}

// Target is the server's recovery target for worker w, rank r.
func (s *QueryServer) Target(w uint64, r uint32) RecoveryTarget {
	return RecoveryTarget{Address: s.ln.Addr().String(), Path: "test/dynamo/backend/worker_kv_query_source_1", WorkerID: w, DPRank: r}
}

// Started receives the number of each query as it arrives.
func (s *QueryServer) Started() <-chan int { return s.started }

func (s *QueryServer) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		start, info, err := readQueryRequest(r)
		if err != nil {
			return
		}
		s.mu.Lock()
		s.n++
		n := s.n
		s.mu.Unlock()
		s.started <- n
		a := s.answer(n, start)
		if a.Hang {
			_, _ = io.Copy(io.Discard, r) // until the client gives up
			return
		}
		if _, err := c.Write([]byte{0, 0, 0, 0}); err != nil {
			return
		}
		if err := s.respond(info, a); err != nil {
			return
		}
	}
}

// readQueryRequest reads one request and returns its start_event_id and
// the callback's address and subject.
func readQueryRequest(r *bufio.Reader) (start *uint64, info map[string]string, err error) {
	var n [4]byte
	skip := func(lenBytes int) error {
		if _, err := io.ReadFull(r, n[:lenBytes]); err != nil {
			return err
		}
		l := int(binary.BigEndian.Uint16(n[:2]))
		_, err := io.CopyN(io.Discard, r, int64(l))
		return err
	}
	if err := skip(2); err != nil { // path
		return nil, nil, err
	}
	if err := skip(2); err != nil { // headers
		return nil, nil, err
	}
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, nil, err
	}
	hdr, body, err := readTwoPart(r)
	if err != nil {
		return nil, nil, err
	}
	var ctrl struct {
		ConnectionInfo struct {
			Info string `json:"info"`
		} `json:"connection_info"`
	}
	if err := json.Unmarshal(hdr, &ctrl); err != nil {
		return nil, nil, err
	}
	if err := json.Unmarshal([]byte(ctrl.ConnectionInfo.Info), &info); err != nil {
		return nil, nil, err
	}
	_, err = readMap(body, "query request", func(key, p []byte) ([]byte, error) {
		if string(key) != "start_event_id" || msgp.IsNil(p) {
			return msgp.Skip(p)
		}
		v, o, err := msgp.ReadUint64Bytes(p)
		start = &v
		return o, err
	})
	return start, info, err
}

func (s *QueryServer) respond(info map[string]string, a QueryAnswer) error {
	cb, err := net.Dial("tcp", info["address"])
	if err != nil {
		return err
	}
	defer cb.Close()
	hs, _ := json.Marshal(map[string]string{"subject": info["subject"], "stream_type": "response"})
	out := appendTwoPart(nil, hs, nil)
	out = appendTwoPart(out, []byte(`{"error":null}`), nil)
	item := msgp.AppendMapHeader(nil, 2)
	item = msgp.AppendString(item, "data")
	item = msgp.AppendMapHeader(item, 1)
	item = msgp.AppendString(item, a.Kind)
	item = msgp.AppendMapHeader(item, 3)
	item = msgp.AppendString(item, "events")
	evs, err := AppendRouterEvents(nil, a.Events)
	if err != nil {
		return err
	}
	item = append(item, evs...)
	item = msgp.AppendString(item, "last_event_id")
	item = msgp.AppendUint64(item, a.LastEventID)
	item = msgp.AppendString(item, "reset_scope")
	item = msgp.AppendString(item, cmp.Or(a.ResetScope, ResetScopeAll))
	item = msgp.AppendString(item, "complete_final")
	item = msgp.AppendBool(item, false)
	out = appendTwoPart(out, nil, item)
	final := msgp.AppendMapHeader(nil, 1)
	final = msgp.AppendString(final, "complete_final")
	final = msgp.AppendBool(final, true)
	out = appendTwoPart(out, nil, final)
	out = appendTwoPart(out, []byte(`"sentinel"`), nil)
	_, err = cb.Write(out)
	return err
}
