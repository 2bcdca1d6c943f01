package natsx

import (
	"context"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/scheduling"
)

// Record kinds of a FuzzReplicaMessages input: each record is a kind
// byte, a 2-byte big-endian length and that many payload bytes.
const (
	recEvent  = iota // a message on <prefix>.events
	recLoad          // a message on <prefix>.load
	recHeads         // a message on <prefix>.heads
	recSettle        // wait for the repairs and resyncs in flight and apply their results
	recMarked        // a message on <prefix>.events whose EpochHeader is its first 8 bytes, big-endian
	numRecs
)

// appendRecord appends one FuzzReplicaMessages record.
func appendRecord(dst []byte, kind byte, payload []byte) []byte {
	dst = append(dst, kind)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(payload)))
	return append(dst, payload...)
}

// fuzzReplicaSeeds returns message sequences that reach the replica's
// paths: in-order events, a gap, a restart marker, heads ahead of the
// stream, a peer's load in order and with a lost batch, and a restarted
// peer.
func fuzzReplicaSeeds(t testing.TB) [][]byte {
	w := kvroute.WorkerKey{ID: 7, Rank: 1}
	event := func(id uint64, ext, parent kvroute.ExternalHash) []byte {
		ev := kvroute.Event{Kind: kvroute.EventStored, Worker: w, ID: id,
			Blocks: []kvroute.StoredBlock{{External: ext, Hash: kvroute.BlockHash(ext) * 3}}, HasParent: parent != 0, Parent: parent}
		var d kvevents.DynamoEvent
		if err := d.FromEvent(&ev, kvroute.Hasher{}); err != nil {
			t.Fatal(err)
		}
		msg, err := kvevents.AppendDynamoEvent(nil, &d)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	cleared := func() []byte {
		var d kvevents.DynamoEvent
		if err := d.FromEvent(&kvroute.Event{Kind: kvroute.EventCleared, Worker: w}, kvroute.Hasher{}); err != nil {
			t.Fatal(err)
		}
		msg, err := kvevents.AppendDynamoEvent(nil, &d)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	add := loadOp{op: opAdd, id: 9, worker: w, prefillTokens: 64, blocks: []kvroute.SeqHash{1, 2}}
	batch := func(incarnation, seq uint64, ops ...loadOp) []byte {
		return appendLoadBatch(nil, &loadBatch{origin: "peer", incarnation: incarnation, seq: seq, ops: ops})
	}
	var inOrder, gap, restart, peer []byte
	inOrder = appendRecord(inOrder, recEvent, event(1, 11, 0))
	inOrder = appendRecord(inOrder, recEvent, event(2, 12, 11))
	inOrder = appendRecord(inOrder, recEvent, event(2, 12, 11)) // a duplicate
	inOrder = appendRecord(inOrder, recEvent, []byte{0xc1})     // malformed
	gap = appendRecord(gap, recEvent, event(1, 11, 0))
	gap = appendRecord(gap, recEvent, event(3, 13, 12))
	gap = appendRecord(gap, recHeads, appendHeads(nil, &heads{epoch: 1, last: []workerID{{worker: w, id: 5}}}))
	gap = appendRecord(gap, recSettle, nil)
	gap = appendRecord(gap, recEvent, event(6, 14, 13))
	restart = appendRecord(restart, recHeads, appendHeads(nil, &heads{epoch: 1, last: []workerID{{worker: w, id: 0}}}))
	restart = appendRecord(restart, recEvent, event(1, 11, 0))
	restart = appendRecord(restart, recEvent, cleared())
	restart = appendRecord(restart, recHeads, appendHeads(nil, &heads{epoch: 2, last: []workerID{{worker: w, id: 1}}}))
	restart = appendRecord(restart, recSettle, nil)
	restart = appendRecord(restart, recMarked, append(binary.BigEndian.AppendUint64(nil, 3), cleared()...))
	restart = appendRecord(restart, recEvent, event(1, 21, 0))
	restart = appendRecord(restart, recHeads, appendHeads(nil, &heads{epoch: 3, last: []workerID{{worker: w, id: 1}}}))
	peer = appendRecord(peer, recLoad, batch(1, 1, add, loadOp{op: opPrefillDone, id: 9}, loadOp{op: opOutput, id: 9, output: 40}))
	peer = appendRecord(peer, recLoad, batch(1, 3, loadOp{op: opFree, id: 9}, loadOp{op: 200, id: 9}))
	peer = appendRecord(peer, recLoad, batch(1, 3)) // a heartbeat ahead of the applied batches
	peer = appendRecord(peer, recSettle, nil)
	peer = appendRecord(peer, recLoad, batch(2, 1, add)) // the peer restarted
	peer = appendRecord(peer, recLoad, batch(1, 2, add)) // from before the restart
	return [][]byte{inOrder, gap, restart, peer}
}

// replicaHarness runs a Replica's message handling without its Run loop:
// no relay and no peer answers on the NATS server, so the repairs and
// resyncs it starts give up within milliseconds (the worker is reset, the
// peer's resync fails), as they do in a deployment without them.
type replicaHarness struct {
	r *Replica
}

func newReplicaHarness(f testing.TB) *replicaHarness {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		f.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		f.Fatal("nats server did not start")
	}
	f.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(nc.Close)
	ix, _ := indexer.New(indexer.Config{})
	tr, _ := scheduling.NewTracker(scheduling.TrackerConfig{})
	r, err := NewReplica(ReplicaConfig{Conn: nc, ID: "me", Index: ix, Tracker: tr, MaxPeerRequests: 4,
		SyncTimeout: time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	if r.replies, err = openReplies(nc); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(r.replies.close)
	return &replicaHarness{r: r}
}

// newLoop gives the replica a fresh index and tracker and returns a loop
// and the function that ends it (cancels it and waits for its goroutines).
func (h *replicaHarness) newLoop(t *testing.T) (*loop, func(), *indexer.Index, *scheduling.Tracker) {
	ix, err := indexer.New(indexer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := scheduling.NewTracker(scheduling.TrackerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	h.r.cfg.Index, h.r.cfg.Tracker = ix, tr
	ctx, cancel := context.WithCancel(context.Background())
	l := &loop{r: h.r, ctx: ctx, conn: h.r.cfg.Conn,
		last: map[kvroute.WorkerKey]uint64{}, epochs: map[kvroute.WorkerKey]uint64{}, repairs: map[kvroute.WorkerKey]*repairState{},
		peers: map[string]*peerState{}, repaired: make(chan repairResult, 16), resynced: make(chan resyncResult, 16)}
	return l, func() { cancel(); l.wg.Wait() }, ix, tr
}

// settle applies the results of the loop's repairs and resyncs as Run
// does when they arrive, until none is under way.
func (l *loop) settle(t *testing.T) {
	timeout := time.After(time.Minute)
	for len(l.repairs) > 0 || l.resyncing() {
		select {
		case res := <-l.repaired:
			l.finishRepair(res)
		case res := <-l.resynced:
			l.finishResync(res)
		case <-timeout:
			t.Fatalf("repairs %d or resyncs still under way after a minute", len(l.repairs))
		}
	}
}

// resyncing reports whether a peer's resync is under way.
func (l *loop) resyncing() bool {
	for _, ps := range l.peers {
		if ps.resyncing {
			return true
		}
	}
	return false
}

// FuzzReplicaMessages feeds a Replica any sequence of event, load and
// heads messages and checks after each one that a message that does not
// decode changes nothing, that every peer request the replica keeps is
// in the tracker and nothing else is, and that a peer never has more than
// MaxPeerRequests requests.
func FuzzReplicaMessages(f *testing.F) {
	for _, s := range fuzzReplicaSeeds(f) {
		f.Add(s)
	}
	h := newReplicaHarness(f)
	f.Fuzz(func(t *testing.T, p []byte) { h.run(t, p) })
}

// run plays the records of p on a fresh loop, checking the invariants of
// FuzzReplicaMessages after each.
func (h *replicaHarness) run(t *testing.T, p []byte) {
	l, end, ix, tr := h.newLoop(t)
	defer end()
	for steps := 0; len(p) >= 3 && steps < 64; steps++ {
		kind, n := p[0]%numRecs, int(binary.BigEndian.Uint16(p[1:3]))
		p = p[3:]
		n = min(n, len(p))
		msg := p[:n]
		p = p[n:]
		before, trBefore, bad := ix.Size(), tr.Len(), h.r.stats.malformed.Load()
		switch kind {
		case recEvent:
			l.handleEvent(&nats.Msg{Data: msg})
		case recMarked:
			m := &nats.Msg{Data: msg}
			if len(msg) >= 8 {
				m.Header = nats.Header{EpochHeader: []string{strconv.FormatUint(binary.BigEndian.Uint64(msg), 10)}}
				m.Data = msg[8:]
			}
			l.handleEvent(m)
		case recLoad:
			l.handleLoad(msg)
		case recHeads:
			l.handleHeads(msg)
		case recSettle:
			l.settle(t)
		}
		if kind != recSettle && h.r.stats.malformed.Load() != bad {
			if after := ix.Size(); after != before || tr.Len() != trBefore {
				t.Fatalf("a malformed message changed the state: index %+v → %+v, tracker %d → %d",
					before, after, trBefore, tr.Len())
			}
		}
		kept := 0
		for origin, ps := range l.peers {
			if len(ps.reqs) > h.r.cfg.MaxPeerRequests {
				t.Fatalf("peer %q has %d requests, bound %d", origin, len(ps.reqs), h.r.cfg.MaxPeerRequests)
			}
			kept += len(ps.reqs)
		}
		if kept != tr.Len() {
			t.Fatalf("replica keeps %d peer requests, tracker holds %d", kept, tr.Len())
		}
	}
	l.settle(t)
}

// The seeds reach the paths they are meant to: gaps repaired by a reset,
// a relay restart, a peer's lost batch, its restart, and a malformed
// message.
func TestReplicaFuzzSeedsReachPaths(t *testing.T) {
	h := newReplicaHarness(t)
	for _, s := range fuzzReplicaSeeds(t) {
		h.run(t, s)
	}
	st := h.r.Stats()
	require.Positive(t, st.Applied)
	require.Positive(t, st.Gaps)
	require.Positive(t, st.Resets)
	require.Positive(t, st.LoadOps)
	require.Positive(t, st.PeerResyncs)
	require.Positive(t, st.PeerDrops)
	require.Positive(t, st.Malformed)
}

// FuzzFetchReply checks the chunk sequencing of repairs and resyncs: a
// reply is a 503 (no responders), a chunk of a newer wire version, a
// chunk that does not decode, a chunk out of order (all errors wrapping
// nats.ErrNoResponders, errWireVersion or kvevents.ErrMalformed), or the
// next chunk. A status starting with "v" is the chunk's wire version.
func FuzzFetchReply(f *testing.F) {
	w := kvroute.WorkerKey{ID: 7}
	for i, final := range []bool{false, true} {
		dump, err := appendDumpChunk(nil, &dumpChunk{index: uint64(i), final: final, last: []workerID{{worker: w, id: 4}}})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(dump, uint64(i), "")
		f.Add(appendReplayChunk(nil, &replayChunk{index: uint64(i), final: final, ok: true, msgs: [][]byte{{1}}}), uint64(0), "")
	}
	f.Add([]byte{}, uint64(0), "503")
	f.Add([]byte{1}, uint64(0), "503")
	f.Add(appendReplayChunk(nil, &replayChunk{final: true}), uint64(0), "v2") // of a newer wire version
	f.Add(appendReplayChunk(nil, &replayChunk{final: true}), uint64(0), "v1")
	f.Fuzz(func(t *testing.T, data []byte, next uint64, status string) {
		m := &nats.Msg{Data: data, Header: nats.Header{}}
		version, newer := "", false
		if v, ok := strings.CutPrefix(status, "v"); ok { // a wire version, not a status
			m.Header.Set(WireVersionHeader, v)
			version, status = v, ""
			newer = errors.Is(checkWire(m.Header), errWireVersion)
		}
		if status != "" {
			m.Header.Set("Status", status)
		}
		var chunks []func([]byte) (uint64, bool, error)
		chunks = append(chunks, func(p []byte) (uint64, bool, error) {
			c, err := decodeDumpChunk(p)
			if err != nil {
				return 0, false, err
			}
			return c.index, c.final, nil
		}, func(p []byte) (uint64, bool, error) {
			c, err := decodeReplayChunk(p)
			if err != nil {
				return 0, false, err
			}
			return c.index, c.final, nil
		})
		for _, chunk := range chunks {
			final, err := fetchReply(m, next, chunk)
			switch {
			case len(data) == 0 && status == "503":
				if !errors.Is(err, nats.ErrNoResponders) {
					t.Fatalf("503 gave %v", err)
				}
			case newer:
				if !errors.Is(err, errWireVersion) || final {
					t.Fatalf("a chunk of wire version %q gave %v (final %v)", version, err, final)
				}
			case err != nil:
				if !errors.Is(err, kvevents.ErrMalformed) || final {
					t.Fatalf("error %v (final %v) does not wrap ErrMalformed", err, final)
				}
			default:
				i, wantFinal, cerr := chunk(data)
				if cerr != nil || i != next || final != wantFinal {
					t.Fatalf("accepted chunk %d (final %v, err %v) as chunk %d (final %v)", i, wantFinal, cerr, next, final)
				}
			}
		}
	})
}
