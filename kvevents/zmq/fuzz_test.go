package zmq

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
)

// checkSink is a Sink that checks the order the subscriber promises: per
// worker, event IDs grow by exactly one until the worker is reset.
type checkSink struct {
	t      *testing.T
	last   map[kvroute.WorkerKey]uint64 // last ID applied since the last reset
	known  map[kvroute.WorkerKey]bool   // reset at least once, last is meaningful
	events int
}

func (c *checkSink) Apply(ev *kvroute.Event) error {
	c.events++
	if !c.known[ev.Worker] {
		c.t.Fatalf("event %s for worker %v before any reset of it", ev, ev.Worker)
	}
	if ev.ID != c.last[ev.Worker]+1 && c.last[ev.Worker] != 0 {
		c.t.Fatalf("worker %v: event ID %d after %d", ev.Worker, ev.ID, c.last[ev.Worker])
	}
	c.last[ev.Worker] = ev.ID
	return nil
}

func (c *checkSink) ResetWorker(w kvroute.WorkerKey) {
	c.known[w] = true
	c.last[w] = 0
}

// goldenPayloads returns the engine payloads captured in kvevents/testdata.
func goldenPayloads(f *testing.F) [][]byte {
	var out [][]byte
	for _, pat := range []string{"../testdata/*.msgpack", "../testdata/captured/*.msgpack"} {
		names, err := filepath.Glob(pat)
		if err != nil {
			f.Fatal(err)
		}
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err != nil {
				f.Fatal(err)
			}
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		f.Fatal("no golden payloads in kvevents/testdata")
	}
	return out
}

// fuzzMsg is one message of a fuzz input: a live PUB message or a reply of
// the replay socket.
type fuzzMsg struct {
	replay bool
	frames [][]byte
}

// decodeFuzzMsgs turns fuzz bytes into messages. Each message starts with
// a control byte: bit 0 selects live or replay; bits 1-2 select a
// well-formed message (0: topic, sequence number from the next byte, 0xff
// meaning the replay end marker, and golden payload number next byte, or
// 1: the same with a raw payload of next-byte length) or raw frames
// (2, 3: next byte mod 5 frames of next-byte length each).
func decodeFuzzMsgs(in []byte, golden [][]byte) []fuzzMsg {
	pos := 0
	next := func() byte {
		if pos >= len(in) {
			return 0
		}
		pos++
		return in[pos-1]
	}
	raw := func() []byte {
		n := min(int(next()), len(in)-pos)
		b := in[pos : pos+n]
		pos += n
		return b
	}
	var msgs []fuzzMsg
	for pos < len(in) {
		c := next()
		m := fuzzMsg{replay: c&1 == 1}
		switch (c >> 1) & 3 {
		case 0, 1:
			s := uint64(next())
			if s == 0xff {
				s = endSeq
			}
			var seq [8]byte
			binary.BigEndian.PutUint64(seq[:], s)
			var payload []byte
			if (c>>1)&3 == 0 {
				payload = golden[int(next())%len(golden)]
			} else {
				payload = raw()
			}
			m.frames = [][]byte{[]byte("kv"), seq[:], payload}
		default:
			for range next() % 5 {
				m.frames = append(m.frames, raw())
			}
		}
		msgs = append(msgs, m)
	}
	return msgs
}

// FuzzHandleMessages feeds live messages and replay replies, well-formed
// or not, in any order, through the subscriber's per-message handling (the
// code Run runs on each received message, without sockets). It checks that
// nothing panics, that events reach the sink numbered consecutively per
// worker between resets, that a message with bad framing changes nothing
// but the Malformed count, that an applied live message moves the
// expected sequence number past it, and that the counters agree.
func FuzzHandleMessages(f *testing.F) {
	golden := goldenPayloads(f)
	// In order; a gap; a restart; a duplicate; replay replies around a gap.
	f.Add([]byte{0, 0, 0, 0, 1, 1, 0, 2, 2})
	f.Add([]byte{0, 5, 3, 0, 9, 4, 1, 6, 5, 1, 7, 6, 1, 0xff, 0})
	f.Add([]byte{0, 10, 1, 0, 3, 2, 0, 3, 2})
	f.Add([]byte{2, 1, 3, 'a', 'b', 'c', 4, 3, 2, 'k', 'v', 8, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{0, 0, 0, 7, 2, 1, 0, 3, 2, 'x', 'y'})
	f.Fuzz(func(t *testing.T, in []byte) {
		sink := &checkSink{t: t, last: map[kvroute.WorkerKey]uint64{}, known: map[kvroute.WorkerKey]bool{}}
		s, err := New(Config{Endpoint: "tcp://127.0.0.1:1", Topic: "kv", Sink: sink,
			Converter: kvevents.ConverterConfig{Worker: 7, BlockSize: 16}})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var r *replayState
		for _, m := range decodeFuzzMsgs(in, golden) {
			before := s.Stats()
			next, lastLive := s.next, s.lastLive
			if !m.replay {
				r = nil
				s.handleLive(ctx, m.frames)
				after := s.Stats()
				if len(m.frames) != 3 || len(m.frames[1]) != 8 {
					if after.Malformed != before.Malformed+1 || s.next != next || s.lastLive != lastLive || after.Applied != before.Applied {
						t.Fatalf("badly framed message changed state: %+v -> %+v", before, after)
					}
					continue
				}
				if !strings.HasPrefix(string(m.frames[0]), "kv") {
					if after != before || s.next != next {
						t.Fatalf("message of another topic changed state: %+v -> %+v", before, after)
					}
					continue
				}
				seq := binary.BigEndian.Uint64(m.frames[1])
				if after.Received != before.Received+1 || s.lastLive != seq {
					t.Fatalf("live message %d: received %d -> %d, last live %d", seq, before.Received, after.Received, s.lastLive)
				}
				if after.Duplicates == before.Duplicates && s.next != seq+1 {
					t.Fatalf("live message %d applied but next is %d", seq, s.next)
				}
			} else {
				if r == nil {
					r = &replayState{from: s.next, first: true}
				}
				if s.handleReplay(r, m.frames) {
					r = nil
				}
			}
			checkStats(t, s.Stats(), sink)
		}
	})
}

// checkStats checks the counters against each other and the sink.
func checkStats(t *testing.T, st Stats, sink *checkSink) {
	t.Helper()
	if st.Applied+st.ApplyErrs != uint64(sink.events) {
		t.Fatalf("applied %d + rejected %d, sink saw %d", st.Applied, st.ApplyErrs, sink.events)
	}
	if st.AppliedStored+st.AppliedRemoved+st.AppliedCleared != st.Applied {
		t.Fatalf("applied %d is not stored+removed+cleared: %s", st.Applied, fmt.Sprint(st))
	}
}
