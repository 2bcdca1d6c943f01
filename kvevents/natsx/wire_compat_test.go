package natsx

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/scheduling"
)

// wireGoldenFiles hold, for each major wire version, every message that
// version added as the encoders wrote it when the version was fixed: one
// "name hex" line each. The files never change; decoders must read every
// line of them for ever.
var wireGoldenFiles = map[int]string{1: "testdata/wire-v1.txt", 2: "testdata/wire-v2.txt"}

// writer encodes the messages record by record, as a writer of wire
// version 1 does (extra 0) or as a newer writer might (extra > 0): each
// record array (a message, a worker-ID entry, a load operation, an active
// request) then ends with extra elements this version does not know, of
// assorted kinds.
type writer struct{ extra int }

// rec encodes a record of the given encoded elements and w.extra unknown
// ones.
func (w writer) rec(elems ...[]byte) []byte {
	dst := msgp.AppendArrayHeader(nil, uint32(len(elems)+w.extra))
	for _, e := range elems {
		dst = append(dst, e...)
	}
	for i := range w.extra {
		switch i % 4 {
		case 0:
			dst = msgp.AppendString(dst, "a field of a newer version")
		case 1:
			dst = msgp.AppendMapHeader(dst, 2)
			dst = msgp.AppendString(dst, "k")
			dst = msgp.AppendArrayHeader(msgp.AppendArrayHeader(dst, 2), 0)
			dst = msgp.AppendNil(dst)
			dst = msgp.AppendUint64(msgp.AppendString(dst, "n"), 1<<60)
		case 2:
			dst = msgp.AppendFloat64(dst, 0.5)
		default:
			dst = msgp.AppendBytes(dst, []byte{0xc1, 0xff})
		}
	}
	return dst
}

// list encodes a list of encoded items; lists get no unknown elements:
// their length is their content.
func list(items ...[]byte) []byte {
	dst := msgp.AppendArrayHeader(nil, uint32(len(items)))
	for _, it := range items {
		dst = append(dst, it...)
	}
	return dst
}

func u64(v uint64) []byte { return msgp.AppendUint64(nil, v) }
func i64(v int64) []byte  { return msgp.AppendInt64(nil, v) }
func boolean(v bool) []byte {
	return msgp.AppendBool(nil, v)
}

func (w writer) workerIDs(l []workerID) []byte {
	var items [][]byte
	for _, x := range l {
		elems := [][]byte{u64(uint64(x.worker.ID)), msgp.AppendUint32(nil, uint32(x.worker.Rank)), u64(x.id)}
		if x.epoch != 0 || w.extra > 0 { // a writer that appends fields writes the epoch, 0 when not known
			elems = append(elems, u64(x.epoch))
		}
		items = append(items, w.rec(elems...))
	}
	return list(items...)
}

func (w writer) loadOp(o *loadOp) []byte {
	var blocks [][]byte
	for _, b := range o.blocks {
		blocks = append(blocks, u64(uint64(b)))
	}
	return w.rec(msgp.AppendUint8(nil, o.op), u64(uint64(o.id)), u64(uint64(o.worker.ID)),
		msgp.AppendUint32(nil, uint32(o.worker.Rank)), msgp.AppendInt(nil, o.prefillTokens), boolean(o.prefillDone),
		msgp.AppendInt(nil, o.output), list(blocks...))
}

// wireCase is one message: its value, how a writer encodes it, and the
// decoder that reads it back into the value; version is the major wire
// version that added it (0 for 1).
type wireCase struct {
	version int
	name    string
	value   any
	write   func(w writer) []byte
	encode  func() []byte // the package's encoder
	decode  func(p []byte) (any, error)
}

// wireCases returns one message of every kind the package sends, with
// every optional part present in some.
func wireCases(t testing.TB) []wireCase {
	w7 := kvroute.WorkerKey{ID: 7, Rank: 1}
	w8 := kvroute.WorkerKey{ID: 1 << 40}
	add := loadOp{op: opAdd, id: 9, worker: w7, prefillTokens: 64, prefillDone: true, output: 3, blocks: []kvroute.SeqHash{1, 1 << 63}}
	ops := []loadOp{add, {op: opPrefillDone, id: 9}, {op: opOutput, id: 9, output: 4}, {op: opFree, id: 1 << 50}}
	ev := kvroute.Event{Kind: kvroute.EventStored, Worker: w7, ID: 4,
		Blocks: []kvroute.StoredBlock{{External: 5, Hash: 6}}, HasParent: true, Parent: 3}
	var stored kvevents.DynamoEvent
	require.NoError(t, stored.FromEvent(&ev, kvroute.Hasher{}))
	storedMsg, err := kvevents.AppendDynamoEvent(nil, &stored)
	require.NoError(t, err)
	var removed kvevents.DynamoEvent
	require.NoError(t, removed.FromEvent(&kvroute.Event{Kind: kvroute.EventRemoved, Worker: w8, Removed: []kvroute.ExternalHash{5, 9}}, kvroute.Hasher{}))
	removedMsg, err := kvevents.AppendDynamoEvent(nil, &removed)
	require.NoError(t, err)

	batch := loadBatch{origin: "router-1", incarnation: 1 << 62, seq: 3, ops: ops}
	heartbeat := loadBatch{origin: "router-1", incarnation: 2, seq: 300}
	active := activeChunk{index: 2, final: true, incarnation: 5, seq: 7,
		reqs: []activeReq{{ttlMillis: 1500, op: add}, {ttlMillis: 1, op: loadOp{op: opAdd, id: 10, worker: w8, prefillTokens: 1}}}}
	dump0 := dumpChunk{last: []workerID{{worker: w7, id: 4, epoch: 1 << 62}, {worker: w8, id: 2}},
		events: []kvevents.DynamoEvent{stored, removed}}
	dumpN := dumpChunk{index: 3, final: true, last: []workerID{}, events: []kvevents.DynamoEvent{stored}}
	var cleared kvevents.DynamoEvent
	require.NoError(t, cleared.FromEvent(&kvroute.Event{Kind: kvroute.EventCleared, Worker: w8}, kvroute.Hasher{}))
	dumpSeq0 := dumpChunk{last: []workerID{{worker: w7, id: 4, epoch: 1 << 62}}, seqHashes: true,
		events: []kvevents.DynamoEvent{stored, removed, cleared}}
	dumpSeqN := dumpChunk{index: 1, final: true, last: []workerID{}, seqHashes: true, events: []kvevents.DynamoEvent{stored}}
	have := haveReq{from: "router-2", want: workerID{worker: w7, id: 4, epoch: 9}}
	haveNoEpoch := haveReq{from: "router-2", want: workerID{worker: w8, id: 1}}
	hd := heads{epoch: 1 << 61, last: []workerID{{worker: w7, id: 4}, {worker: w8, id: 0}}}
	replay := replayReq{worker: w8, from: 2, to: 1 << 33}
	replayOK := replayChunk{final: true, ok: true, msgs: [][]byte{storedMsg, removedMsg}}
	replayGone := replayChunk{index: 1, final: true}
	wdump := []workerID{{worker: w7, epoch: 9}}

	dumpWrite := func(c *dumpChunk) func(w writer) []byte {
		return func(w writer) []byte {
			var evs [][]byte
			for i := range c.events {
				b, err := kvevents.AppendDynamoEvent(nil, &c.events[i])
				require.NoError(t, err)
				evs = append(evs, b)
			}
			elems := [][]byte{u64(c.index), boolean(c.final), w.workerIDs(c.last), list(evs...)}
			if c.seqHashes || w.extra > 0 { // a writer that appends fields writes the kind of hashes
				elems = append(elems, boolean(c.seqHashes))
			}
			return w.rec(elems...)
		}
	}
	dumpEncode := func(c *dumpChunk) func() []byte {
		return func() []byte {
			b, err := appendDumpChunk(nil, c)
			require.NoError(t, err)
			return b
		}
	}
	dumpDecode := func(p []byte) (any, error) {
		c, err := decodeDumpChunk(p)
		if err != nil {
			return nil, err
		}
		return *c, nil
	}
	batchWrite := func(b *loadBatch) func(w writer) []byte {
		return func(w writer) []byte {
			var items [][]byte
			for i := range b.ops {
				items = append(items, w.loadOp(&b.ops[i]))
			}
			return w.rec(msgp.AppendString(nil, b.origin), u64(b.incarnation), u64(b.seq), list(items...))
		}
	}
	batchDecode := func(p []byte) (any, error) {
		var b loadBatch
		err := decodeLoadBatch(p, &b)
		if len(b.ops) == 0 {
			b.ops = nil
		}
		return b, err
	}
	haveWrite := func(h *haveReq) func(w writer) []byte {
		return func(w writer) []byte {
			return w.rec(msgp.AppendString(nil, h.from), w.workerIDs([]workerID{h.want}))
		}
	}
	haveDecode := func(p []byte) (any, error) { return decodeHaveReq(p) }
	replayWrite := func(c *replayChunk) func(w writer) []byte {
		return func(w writer) []byte {
			var items [][]byte
			for _, m := range c.msgs {
				items = append(items, msgp.AppendBytes(nil, m))
			}
			return w.rec(u64(c.index), boolean(c.final), boolean(c.ok), list(items...))
		}
	}
	replayDecode := func(p []byte) (any, error) {
		c, err := decodeReplayChunk(p)
		if err != nil {
			return nil, err
		}
		return *c, nil
	}

	return []wireCase{
		{0, "load-batch", batch, batchWrite(&batch),
			func() []byte { return appendLoadBatch(nil, &batch) }, batchDecode},
		{0, "load-heartbeat", heartbeat, batchWrite(&heartbeat),
			func() []byte { return appendLoadBatch(nil, &heartbeat) }, batchDecode},
		{0, "active-chunk", active,
			func(w writer) []byte {
				var items [][]byte
				for i := range active.reqs {
					items = append(items, w.rec(i64(active.reqs[i].ttlMillis), w.loadOp(&active.reqs[i].op)))
				}
				return w.rec(u64(active.index), boolean(active.final), u64(active.incarnation), u64(active.seq), list(items...))
			},
			func() []byte { return appendActiveChunk(nil, &active) },
			func(p []byte) (any, error) {
				c, err := decodeActiveChunk(p)
				if err != nil {
					return nil, err
				}
				return *c, nil
			}},
		{0, "dump-chunk-0", dump0, dumpWrite(&dump0), dumpEncode(&dump0), dumpDecode},
		{0, "dump-chunk-n", dumpN, dumpWrite(&dumpN), dumpEncode(&dumpN), dumpDecode},
		{2, "dump-chunk-seq-0", dumpSeq0, dumpWrite(&dumpSeq0), dumpEncode(&dumpSeq0), dumpDecode},
		{2, "dump-chunk-seq-n", dumpSeqN, dumpWrite(&dumpSeqN), dumpEncode(&dumpSeqN), dumpDecode},
		{0, "have-request", have, haveWrite(&have), func() []byte { return appendHaveReq(nil, &have) }, haveDecode},
		{0, "have-request-no-epoch", haveNoEpoch, haveWrite(&haveNoEpoch),
			func() []byte { return appendHaveReq(nil, &haveNoEpoch) }, haveDecode},
		{0, "heads", hd, func(w writer) []byte { return w.rec(u64(hd.epoch), w.workerIDs(hd.last)) },
			func() []byte { return appendHeads(nil, &hd) },
			func(p []byte) (any, error) { return decodeHeads(p) }},
		{0, "replay-request", replay,
			func(w writer) []byte {
				return w.rec(u64(uint64(replay.worker.ID)), msgp.AppendUint32(nil, uint32(replay.worker.Rank)),
					u64(replay.from), u64(replay.to))
			},
			func() []byte { return appendReplayReq(nil, &replay) },
			func(p []byte) (any, error) { return decodeReplayReq(p) }},
		{0, "replay-chunk", replayOK, replayWrite(&replayOK),
			func() []byte { return appendReplayChunk(nil, &replayOK) }, replayDecode},
		{0, "replay-chunk-gone", replayGone, replayWrite(&replayGone),
			func() []byte { return appendReplayChunk(nil, &replayGone) }, replayDecode},
		{0, "worker-dump-request", wdump, func(w writer) []byte { return w.workerIDs(wdump) },
			func() []byte { return appendWorkerIDs(nil, wdump) },
			func(p []byte) (any, error) { return readWorkerIDsMsg(p) }},
	}
}

// readGolden returns the messages of the golden file of wire version v
// by name.
func readGolden(t *testing.T, v int) map[string][]byte {
	f, err := os.Open(wireGoldenFiles[v])
	require.NoError(t, err)
	defer f.Close()
	out := map[string][]byte{}
	s := bufio.NewScanner(f)
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hx, ok := strings.Cut(line, " ")
		require.True(t, ok, "line %q", line)
		b, err := hex.DecodeString(hx)
		require.NoError(t, err, name)
		out[name] = b
	}
	require.NoError(t, s.Err())
	return out
}

// Every message of every wire version as it was first written decodes to
// its value, and the encoders still write exactly those bytes.
func TestWireGolden(t *testing.T) {
	byVersion := map[int][]wireCase{}
	for _, c := range wireCases(t) {
		v := max(c.version, 1)
		byVersion[v] = append(byVersion[v], c)
	}
	require.Len(t, byVersion, WireVersion, "a wire version without messages")
	for v := 1; v <= WireVersion; v++ {
		golden, cases := readGolden(t, v), byVersion[v]
		require.Len(t, golden, len(cases), "version %d", v)
		for _, c := range cases {
			t.Run(fmt.Sprintf("v%d/%s", v, c.name), func(t *testing.T) {
				p, ok := golden[c.name]
				require.True(t, ok, "no golden message")
				got, err := c.decode(p)
				require.NoError(t, err)
				require.Equal(t, c.value, got)
				require.Equal(t, p, c.encode(), "the encoder's bytes changed")
				require.Equal(t, p, c.write(writer{}), "the test's writer differs from the encoder")
			})
		}
	}
}

// Records with elements a newer writer appended decode as without them:
// a newer replica's or relay's messages do not break this one.
func TestWireIgnoresUnknownTrailingElements(t *testing.T) {
	for _, c := range wireCases(t) {
		for _, extra := range []int{1, 2, 5} {
			t.Run(fmt.Sprintf("%s/%d", c.name, extra), func(t *testing.T) {
				p := c.write(writer{extra: extra})
				got, err := c.decode(p)
				require.NoError(t, err, "%d unknown elements", extra)
				require.Equal(t, c.value, got)
				for cut := range p { // a cut anywhere is still an error, never a misreading
					if _, err := c.decode(p[:cut]); err == nil {
						t.Fatalf("a message cut at %d of %d bytes decoded", cut, len(p))
					}
				}
			})
		}
	}
}

// A record shorter than its version's fields is malformed.
func TestWireRejectsShortRecords(t *testing.T) {
	w := writer{}
	tests := []struct {
		name   string
		p      []byte
		decode func([]byte) error
	}{
		{"worker-ID entry of 2", list(w.rec(u64(1), u64(2))), func(p []byte) error { _, err := readWorkerIDsMsg(p); return err }},
		{"heads of 1", w.rec(u64(1)), func(p []byte) error { _, err := decodeHeads(p); return err }},
		{"load op of 7", w.rec(msgp.AppendString(nil, "a"), u64(1), u64(1),
			list(w.rec(u64(1), u64(1), u64(1), u64(1), u64(1), boolean(false), u64(1)))),
			func(p []byte) error { var b loadBatch; return decodeLoadBatch(p, &b) }},
		{"replay request of 3", w.rec(u64(1), u64(0), u64(1)), func(p []byte) error { _, err := decodeReplayReq(p); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorIs(t, tt.decode(tt.p), kvevents.ErrMalformed)
		})
	}
}

func TestCheckWire(t *testing.T) {
	tests := []struct {
		name   string
		header nats.Header
		want   error // nil, errWireVersion or kvevents.ErrMalformed
	}{
		{"no header: version 1 as written before the header", nil, nil},
		{"other headers only", nats.Header{"Status": []string{"200"}}, nil},
		{"version 1", nats.Header{WireVersionHeader: []string{"1"}}, nil},
		{"this version", nats.Header{WireVersionHeader: []string{"2"}}, nil},
		{"a newer major version", nats.Header{WireVersionHeader: []string{"3"}}, errWireVersion},
		{"far newer", nats.Header{WireVersionHeader: []string{"4294967295"}}, errWireVersion},
		{"zero", nats.Header{WireVersionHeader: []string{"0"}}, kvevents.ErrMalformed},
		{"not a number", nats.Header{WireVersionHeader: []string{"1.1"}}, kvevents.ErrMalformed},
		{"negative", nats.Header{WireVersionHeader: []string{"-1"}}, kvevents.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkWire(tt.header)
			if tt.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.want)
		})
	}
}

// startServer runs an in-process NATS server and returns a connection to
// it that the test owns.
func startServer(t *testing.T) *nats.Conn {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	go srv.Start()
	require.True(t, srv.ReadyForConnections(10*time.Second), "nats server did not start")
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// runReplica creates a Replica of cfg and runs it until the test ends.
func runReplica(t *testing.T, cfg ReplicaConfig) *Replica {
	t.Helper()
	r, err := NewReplica(cfg)
	require.NoError(t, err)
	runUntilEnd(t, r.Run)
	return r
}

// runUntilEnd runs fn on a goroutine of its own until the test ends, then
// cancels fn's context and checks that fn returned nil.
func runUntilEnd(t *testing.T, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
}

// A running Replica marks what it sends with its wire version, and drops
// a peer's message of a newer major version unread (counted in
// NewerWire) while it applies the same bytes marked with this version or
// with none. A Publisher does not answer a replay request of a newer
// version.
func TestNewerWireVersionIsDroppedUnread(t *testing.T) {
	nc := startServer(t)
	ix, err := indexer.New(indexer.Config{})
	require.NoError(t, err)
	tr, err := scheduling.NewTracker(scheduling.TrackerConfig{})
	require.NoError(t, err)
	r := runReplica(t, ReplicaConfig{Conn: nc, ID: "me", Index: ix, Tracker: tr,
		LoadHeartbeat: 20 * time.Millisecond, SyncTimeout: 50 * time.Millisecond})
	<-r.Ready()

	load, err := nc.SubscribeSync(loadSubject(DefaultPrefix))
	require.NoError(t, err)
	m, err := load.NextMsg(5 * time.Second) // the replica's heartbeat
	require.NoError(t, err)
	require.Equal(t, "1", m.Header.Get(WireVersionHeader))

	w := kvroute.WorkerKey{ID: 3}
	batch := func(seq uint64, id scheduling.RequestID) []byte {
		return appendLoadBatch(nil, &loadBatch{origin: "peer", incarnation: 1, seq: seq,
			ops: []loadOp{{op: opAdd, id: id, worker: w, prefillTokens: 8}}})
	}
	send := func(data []byte, version string) {
		msg := &nats.Msg{Subject: loadSubject(DefaultPrefix), Data: data}
		if version != "" {
			msg.Header = nats.Header{WireVersionHeader: []string{version}}
		}
		require.NoError(t, nc.PublishMsg(msg))
		require.NoError(t, nc.Flush())
	}
	waitFor := func(what string, cond func() bool) {
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
			time.Sleep(5 * time.Millisecond)
		}
	}
	send(batch(1, 1), strconv.Itoa(WireVersion+1))
	waitFor("the newer message to be counted", func() bool { return r.Stats().NewerWire == 1 })
	require.Zero(t, tr.Len(), "a message of a newer version was applied")
	require.Zero(t, r.Stats().Malformed)
	send(batch(1, 1), "1")
	waitFor("the batch of this version", func() bool { return tr.Len() == 1 })
	send(batch(2, 2), "")
	waitFor("the batch without a version", func() bool { return tr.Len() == 2 })

	pub, err := NewPublisher(PublisherConfig{Conn: nc, HeadsInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	runUntilEnd(t, pub.Serve)
	require.NoError(t, pub.Apply(&kvroute.Event{Kind: kvroute.EventStored, Worker: w,
		Blocks: []kvroute.StoredBlock{{External: 1, Hash: 2}}}))
	heads, err := nc.SubscribeSync(headsSubject(DefaultPrefix))
	require.NoError(t, err)
	m, err = heads.NextMsg(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, "1", m.Header.Get(WireVersionHeader))
	req := appendReplayReq(nil, &replayReq{worker: w, from: 1, to: 1})
	ask := func(version string) (*nats.Msg, error) {
		msg := &nats.Msg{Subject: replaySubject(DefaultPrefix), Data: req, Header: nats.Header{WireVersionHeader: []string{version}}}
		return nc.RequestMsg(msg, 300*time.Millisecond)
	}
	waitFor("the relay to serve replays", func() bool { _, err := ask("1"); return err == nil })
	answer, err := ask("1")
	require.NoError(t, err)
	require.Equal(t, "1", answer.Header.Get(WireVersionHeader))
	c, err := decodeReplayChunk(answer.Data)
	require.NoError(t, err)
	require.True(t, c.ok)
	_, err = ask(strconv.Itoa(WireVersion + 1))
	require.ErrorIs(t, err, nats.ErrTimeout, "a request of a newer version was answered")
}

// A replica dumps its index in chunks of sequence hashes marked as of
// wire version 2, which rebuild the index in a replica whatever its
// Hasher; and a starting replica takes the dump of a peer of version 1,
// whose chunks carry content hashes, hashing them as its own index does.
func TestDumpHashesAcrossWireVersions(t *testing.T) {
	nc := startServer(t)
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	tokens := make([]uint32, 12)
	for i := range tokens {
		tokens[i] = uint32(i * 7)
	}
	w := kvroute.WorkerKey{ID: 5}
	stored := &kvroute.Event{Kind: kvroute.EventStored, Worker: w, ID: 1}
	for i, local := range h.AppendBlockHashes(nil, tokens) {
		stored.Blocks = append(stored.Blocks, kvroute.StoredBlock{External: kvroute.ExternalHash(100 + i), Hash: local})
	}
	ix, err := indexer.New(indexer.Config{Hasher: h})
	require.NoError(t, err)
	require.NoError(t, ix.Apply(stored))
	seqs := h.AppendSeqHashes(nil, tokens)
	held := func(x *indexer.Index) int {
		var res indexer.MatchResult
		x.Match(seqs, &res)
		m, _ := res.Find(w)
		return m.Blocks
	}
	require.Equal(t, 3, held(ix))

	r := runReplica(t, ReplicaConfig{Conn: nc, ID: "dumper", Index: ix, SyncTimeout: 50 * time.Millisecond})
	<-r.Ready()

	// The dump, as a starting replica asks for it.
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	require.NoError(t, err)
	other, err := indexer.New(indexer.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16, Namespace: "x"})})
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		require.NoError(t, publishWire(nc, dumpSubject(DefaultPrefix), inbox, []byte("asker")))
		m, err := sub.NextMsg(200 * time.Millisecond)
		if err != nil {
			require.True(t, time.Now().Before(deadline), "no dump: %v", err)
			continue
		}
		c, err := decodeDumpChunk(m.Data)
		require.NoError(t, err)
		require.True(t, c.seqHashes, "the index's Stored events carry sequence hashes")
		require.Equal(t, "2", m.Header.Get(WireVersionHeader))
		var ev kvroute.Event
		for i := range c.events {
			require.NoError(t, c.events[i].ToEvent(&ev))
			ev.ID, ev.SeqHashes = 0, ev.Kind == kvroute.EventStored
			require.NoError(t, other.Apply(&ev))
		}
		require.True(t, c.final)
		break
	}
	require.Equal(t, 3, held(other), "the dump rebuilt the index under another Hasher")

	// A peer of version 1 answers a starting replica with content hashes.
	var d kvevents.DynamoEvent
	require.NoError(t, d.FromEvent(stored, kvroute.Hasher{}))
	v1, err := appendDumpChunk(nil, &dumpChunk{final: true, last: []workerID{{worker: w, id: 1}}, events: []kvevents.DynamoEvent{d}})
	require.NoError(t, err)
	nc2, err := nats.Connect(nc.ConnectedUrl())
	require.NoError(t, err)
	defer nc2.Close()
	peer, err := nc2.Subscribe(dumpSubject("v1"), func(m *nats.Msg) {
		_ = m.RespondMsg(&nats.Msg{Data: v1, Header: nats.Header{WireVersionHeader: []string{"1"}}})
	})
	require.NoError(t, err)
	defer func() { _ = peer.Unsubscribe() }()
	require.NoError(t, nc2.Flush())
	starting, err := indexer.New(indexer.Config{Hasher: h})
	require.NoError(t, err)
	r2 := runReplica(t, ReplicaConfig{Conn: nc, ID: "starting", Prefix: "v1", Index: starting, SyncTimeout: 5 * time.Second})
	select {
	case <-r2.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the starting replica did not sync")
	}
	require.Equal(t, 3, held(starting), "the version-1 dump was applied as content hashes")
	require.Equal(t, uint64(1), r2.Stats().Syncs)
}

// TestDumpOfManyChunksKeepsSequenceHashes checks a start-up dump of
// sequence hashes that spans many chunks: a chunk that fills up on a
// Stored event starts another, which must say that its hashes are
// sequence hashes too. A replica that starts from it under another Hasher
// holds the same blocks as the one that served it.
func TestDumpOfManyChunksKeepsSequenceHashes(t *testing.T) {
	nc := startServer(t)
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	ix, err := indexer.New(indexer.Config{Hasher: h})
	require.NoError(t, err)
	workers := []kvroute.WorkerKey{{ID: 1}, {ID: 2}, {ID: 3}}
	ext := kvroute.ExternalHash(1)
	for c := range 60 { // chains of 12 blocks, each event one block: many chunk boundaries fall on Stored events
		tokens := make([]uint32, 48)
		for i := range tokens {
			tokens[i] = uint32(c*1000 + i)
		}
		w := workers[c%len(workers)]
		var parent kvroute.ExternalHash
		for i, local := range h.AppendBlockHashes(nil, tokens) {
			ev := &kvroute.Event{Kind: kvroute.EventStored, Worker: w, Blocks: []kvroute.StoredBlock{{External: ext, Hash: local}},
				HasParent: i > 0, Parent: parent}
			require.NoError(t, ix.Apply(ev))
			parent = ext
			ext++
		}
	}
	// Evict some chains' heads, so that the dump has placeholders too.
	for c := 0; c < 60; c += 7 {
		require.NoError(t, ix.Apply(&kvroute.Event{Kind: kvroute.EventRemoved, Worker: workers[c%len(workers)],
			Removed: []kvroute.ExternalHash{kvroute.ExternalHash(1 + 12*c)}}))
	}
	served := runReplica(t, ReplicaConfig{Conn: nc, ID: "served", Index: ix, SyncTimeout: 50 * time.Millisecond})
	<-served.Ready()

	starting, err := indexer.New(indexer.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16, Namespace: "x"})})
	require.NoError(t, err)
	r := runReplica(t, ReplicaConfig{Conn: nc, ID: "starting", Index: starting, SyncTimeout: 5 * time.Second})
	select {
	case <-r.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the starting replica did not sync")
	}
	require.Equal(t, uint64(1), r.Stats().Syncs)
	require.Positive(t, served.Stats().DumpsServed)
	for _, w := range workers {
		want := ix.AppendWorkerBlocks(w, nil)
		got := starting.AppendWorkerBlocks(w, nil)
		slices.Sort(want)
		slices.Sort(got)
		require.Len(t, want, 20*12-3, "worker %v", w) // 20 chains of 12 blocks, 3 heads evicted
		require.Equal(t, want, got, "worker %v: the starting replica's blocks", w)
	}
}
