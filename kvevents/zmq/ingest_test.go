package zmq_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
	kvzmq "github.com/kvroute/kvroute/kvevents/zmq"
	"github.com/kvroute/kvroute/router"
)

// send publishes payload as batch seq, live and in the replay buffer.
func (e *engine) send(seq uint64, payload []byte) {
	e.mu.Lock()
	e.buffer[seq] = payload
	e.mu.Unlock()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	require.NoError(e.t, e.pub.SendMulti(zmq4.NewMsgFrom([]byte("kv"), b[:], payload)))
}

// startSubscriber runs a subscriber for e until the test ends and waits
// until it has received the probe batch 0 (sent until it arrives).
func startSubscriber(t *testing.T, ctx context.Context, e *engine, pubEP, replayEP string, cc kvevents.ConverterConfig, sink kvevents.Sink, probe []byte) *kvzmq.Subscriber {
	sub, err := kvzmq.New(kvzmq.Config{Endpoint: pubEP, ReplayEndpoint: replayEP, Topic: "kv",
		Converter: cc, Sink: sink, IdleTimeout: time.Second, ReplayTimeout: time.Second, MaxBackoff: 100 * time.Millisecond})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() { <-done })
	for sub.Stats().Received == 0 {
		e.send(0, probe)
		select {
		case <-ctx.Done():
			t.Fatal("subscriber never received a message")
		case <-time.After(20 * time.Millisecond):
		}
	}
	return sub
}

func encode(t *testing.T, evs ...kvevents.EngineEvent) []byte {
	p, err := kvevents.AppendBatch(nil, &kvevents.Batch{Timestamp: 1, RankSlot: true, Events: evs})
	require.NoError(t, err)
	return p
}

func storedEvent(ext, parent uint64, tokens []uint32) kvevents.EngineEvent {
	ev := kvevents.EngineEvent{Type: kvevents.BlockStored, Layout: kvevents.LayoutMap, BlockSize: 4, TokenIDs: tokens}
	for i := range len(tokens) / 4 {
		ev.BlockHashes = append(ev.BlockHashes, kvevents.UintHash(ext+uint64(i)))
	}
	if parent != 0 {
		ev.ParentBlockHash = kvevents.UintHash(parent)
	}
	return ev
}

func waitFor(t *testing.T, ctx context.Context, cond func() bool, what string) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestSubscriberMalformedBatchesLoseNothing interleaves 10 malformed
// payloads with 12 valid batches of one block chain: every valid block
// stays indexed and the worker is never reset after its first event.
func TestSubscriberMalformedBatchesLoseNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e, pubEP, replayEP := newEngine(t, ctx, false)
	ix, err := indexer.New(indexer.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})})
	require.NoError(t, err)
	toks := make([]uint32, 48)
	for i := range toks {
		toks[i] = uint32(1000 + i)
	}
	valid := func(i int) []byte {
		parent := uint64(0)
		if i > 0 {
			parent = uint64(100 + i - 1)
		}
		return encode(t, storedEvent(uint64(100+i), parent, toks[i*4:i*4+4]))
	}
	malformed := [][]byte{
		{0xc1},       // never-used msgpack byte
		{0x92, 0xcb}, // truncated timestamp
		{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x81}, // truncated event map
		msgp.AppendString(nil, "not a batch"),
		{0x92, 0x01, 0x91, 0x90},                                 // empty event array
		{0x92, 0x01, 0x91, 0x81, 0xa4, 't', 'y', 'p', 'e', 0x01}, // tag not a string
		{},
		append(valid(3)[:10:10], 0xff), // cut and corrupted
		{0x91, 0x01},                   // one element
		append(valid(4), 0x00),         // trailing bytes
	}
	sub := startSubscriber(t, ctx, e, pubEP, replayEP, kvevents.ConverterConfig{Worker: 9, BlockSize: 4}, ix, valid(0))
	seq := uint64(1)
	for i := 1; i < 12; i++ {
		if i-1 < len(malformed) {
			e.send(seq, malformed[i-1])
			seq++
		}
		e.send(seq, valid(i))
		seq++
	}
	w := kvroute.WorkerKey{ID: 9}
	seqs := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4}).AppendSeqHashes(nil, toks)
	waitFor(t, ctx, func() bool { return sub.Stats().Received >= seq }, "every batch")
	waitFor(t, ctx, func() bool {
		var res indexer.MatchResult
		ix.Match(seqs, &res)
		return len(res.Workers) == 1 && res.Workers[0].Worker == w && res.Workers[0].Blocks == 12
	}, "all 12 blocks")
	st := sub.Stats()
	require.EqualValues(t, 10, st.Malformed)
	require.EqualValues(t, 1, st.Resets) // the first event of the worker only
	require.Zero(t, st.Dropped)
	require.Zero(t, st.UnknownParents)
	require.EqualValues(t, 12, st.AppliedStored)
}

type testWorker struct{ id kvroute.WorkerID }

func (w testWorker) ID() kvroute.WorkerID { return w.id }
func (testWorker) DataParallelRanks() int { return 1 }
func (testWorker) BlockSize() int         { return 4 }
func (testWorker) Role() router.Role      { return router.RoleAggregated }

// TestEndToEndSaltAndImagesIsolate: two engines publish the blocks of
// prompts with equal tokens, one salted (or with image A), the other not
// (or with image B). Through the subscribers, the index and Select, each
// request predicts hits only on the engine that holds its own blocks.
func TestEndToEndSaltAndImagesIsolate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})})
	require.NoError(t, err)
	for id := range kvroute.WorkerID(2) {
		require.NoError(t, r.AddWorker(testWorker{id + 1}))
	}
	text := make([]uint32, 16)
	for i := range text {
		text[i] = uint32(500 + i)
	}
	pad := uint32(151655)
	image := append(append([]uint32{1, 2}, pad, pad, pad, pad, pad, pad), 3, 4, 5, 6, 7, 8, 9, 10)
	imgA := "aaaaaaaaaaaaaaaa0000000000000000000000000000000000000000000000aa"
	imgB := "bbbbbbbbbbbbbbbb0000000000000000000000000000000000000000000000bb"
	hashA, _ := kvroute.MMIdentifierHash(imgA)
	hashB, _ := kvroute.MMIdentifierHash(imgB)
	imageKeys := func(id string) []byte {
		// Blocks of 4: the image spans tokens 2..7, blocks 0 and 1.
		b := msgp.AppendArrayHeader(nil, 4)
		b = msgp.AppendArrayHeader(b, 1)
		b = msgp.AppendArrayHeader(b, 2)
		b = msgp.AppendString(b, id)
		b = msgp.AppendInt(b, 2)
		b = msgp.AppendArrayHeader(b, 1)
		b = msgp.AppendArrayHeader(b, 2)
		b = msgp.AppendString(b, id)
		b = msgp.AppendInt(b, -2)
		return msgp.AppendNil(msgp.AppendNil(b))
	}
	saltKeys := msgp.AppendNil(msgp.AppendNil(msgp.AppendNil(msgp.AppendString(msgp.AppendArrayHeader(msgp.AppendArrayHeader(nil, 4), 1), "tenant-a"))))

	salted := storedEvent(10, 0, text)
	salted.ExtraKeys = saltKeys
	withA := storedEvent(20, 0, image)
	withA.ExtraKeys = imageKeys(imgA)
	plain := storedEvent(30, 0, text)
	withB := storedEvent(40, 0, image)
	withB.ExtraKeys = imageKeys(imgB)

	for id, evs := range map[kvroute.WorkerID][]kvevents.EngineEvent{1: {salted, withA}, 2: {plain, withB}} {
		e, pubEP, replayEP := newEngine(t, ctx, false)
		startSubscriber(t, ctx, e, pubEP, replayEP, kvevents.ConverterConfig{Worker: id, BlockSize: 4}, r.Index(), encode(t, evs...))
	}
	waitFor(t, ctx, func() bool { return r.Index().Stats().Applied >= 4 }, "4 events applied")

	tests := []struct {
		name string
		req  router.Request
		want kvroute.WorkerID
	}{
		{"salted", router.Request{Tokens: text, CacheSalt: "tenant-a"}, 1},
		{"unsalted", router.Request{Tokens: text}, 2},
		{"image A", router.Request{Tokens: image, MM: []kvroute.MMObject{{Hash: hashA, Offset: 2, Length: 6}}}, 1},
		{"image B", router.Request{Tokens: image, MM: []kvroute.MMObject{{Hash: hashB, Offset: 2, Length: 6}}}, 2},
		{"other salt", router.Request{Tokens: text, CacheSalt: "tenant-b"}, 0},
		{"no image", router.Request{Tokens: image}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.req
			req.Explain = true
			d, err := r.Select(ctx, &req)
			require.NoError(t, err)
			defer d.Done(router.Outcome{})
			for _, c := range d.Candidates {
				cached := c.Cached[kvroute.TierDevice]
				if c.Worker.ID == tt.want {
					require.Equal(t, 4, cached, "worker %d", c.Worker.ID)
				} else {
					require.Zero(t, cached, "worker %d", c.Worker.ID)
				}
			}
			if tt.want != 0 {
				require.Equal(t, tt.want, d.Worker.ID)
				require.Equal(t, 4, d.CachedBlocks)
			}
		})
	}
}
