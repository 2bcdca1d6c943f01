package dynamo_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/dynamo"
	"github.com/kvroute/kvroute/scheduling"
)

const testBlock = 4

var testHasher = kvroute.MustHasher(kvroute.HasherConfig{BlockSize: testBlock})

// publisher is a Go PUB socket sending event-plane messages as Dynamo's
// ZMQ transport frames them.
type publisher struct {
	t   *testing.T
	pub zmq4.Socket
	ep  string
}

func newPublisher(t *testing.T, ctx context.Context) *publisher {
	p := &publisher{t: t, pub: zmq4.NewPub(ctx), ep: freeEndpoint(t)}
	require.NoError(t, p.pub.Listen(p.ep))
	t.Cleanup(func() { p.pub.Close() })
	return p
}

func (p *publisher) send(frames [][]byte) {
	require.NoError(p.t, p.pub.SendMulti(zmq4.NewMsgFrom(frames...)))
}

// restart closes p's socket and returns a publisher bound to the same
// endpoint, as an engine that exits and comes back is.
func (p *publisher) restart(ctx context.Context) *publisher {
	require.NoError(p.t, p.pub.Close())
	again := &publisher{t: p.t, pub: zmq4.NewPub(ctx), ep: p.ep}
	require.NoError(p.t, again.pub.Listen(p.ep))
	p.t.Cleanup(func() { again.pub.Close() })
	return again
}

func (p *publisher) message(pubID, seq uint64, topic string, payload []byte) {
	p.send(dynamo.AppendZMQ(&dynamo.Envelope{Topic: topic, PublisherID: pubID, Sequence: seq, PublishedAt: 1, Payload: payload}))
}

// stored is a kv-events payload storing tokens (whole blocks) for worker w
// under parent (0: a root), block hashes = the local hashes.
func stored(t *testing.T, w kvroute.WorkerKey, parent uint64, tokens []uint32) []byte {
	d := kvevents.DynamoEvent{WorkerID: uint64(w.ID), DPRank: uint32(w.Rank), Kind: kvevents.DynamoStored,
		HasParent: parent != 0, ParentHash: parent}
	for _, h := range testHasher.AppendBlockHashes(nil, tokens) {
		d.Blocks = append(d.Blocks, kvevents.DynamoBlock{BlockHash: uint64(h), TokensHash: uint64(h)})
	}
	p, err := dynamo.AppendRouterEvents(nil, []kvevents.DynamoEvent{d})
	require.NoError(t, err)
	return p
}

func tokens(base, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

func matchBlocks(ix *indexer.Index, toks []uint32) int {
	var r indexer.MatchResult
	ix.Match(testHasher.AppendSeqHashes(nil, toks), &r)
	return r.Blocks
}

// startSubscriber runs sub until the test ends and waits until it has
// received a message from pub (probes of a skipped topic).
func startSubscriber(t *testing.T, ctx context.Context, sub *dynamo.Subscriber, pub *publisher) {
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() { require.NoError(t, <-done) })
	waitFor(t, ctx, "the subscriber to connect", func() bool { return sub.Stats().Received > 0 },
		func() { pub.message(999, 0, dynamo.TopicActiveSequences, []byte{0x90}) })
}

// settle waits until sub has received want messages.
func settle(t *testing.T, ctx context.Context, sub *dynamo.Subscriber, want uint64) {
	t.Helper()
	waitFor(t, ctx, "messages", func() bool { return sub.Stats().Received >= want }, nil)
}

func TestSubscriberSequence(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pub := newPublisher(t, ctx)
	ix, err := indexer.New(indexer.Config{Hasher: testHasher})
	require.NoError(t, err)
	sub, err := dynamo.New(dynamo.Config{Sink: ix})
	require.NoError(t, err)
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: pub.ep}))
	startSubscriber(t, ctx, sub, pub)
	base := sub.Stats()

	w := kvroute.WorkerKey{ID: 7, Rank: 1}
	a, b, c := tokens(100, 8), tokens(200, 8), tokens(300, 4)
	aHashes := testHasher.AppendBlockHashes(nil, a)
	steps := []struct {
		name  string
		send  func()
		check func(st dynamo.Stats)
	}{
		{"first message mid-stream is applied", func() { pub.message(1, 5, dynamo.TopicKVEvents, stored(t, w, 0, a[:4])) },
			func(st dynamo.Stats) { require.Equal(t, uint64(1), st.Applied); require.Zero(t, st.Gaps) }},
		{"next sequence extends the chain", func() { pub.message(1, 6, dynamo.TopicKVEvents, stored(t, w, uint64(aHashes[0]), a[4:])) },
			func(st dynamo.Stats) {
				require.Equal(t, uint64(2), st.Applied)
				require.Equal(t, 2, matchBlocks(ix, a))
			}},
		{"a repeated sequence is a duplicate", func() { pub.message(1, 6, dynamo.TopicKVEvents, stored(t, w, 0, c)) },
			func(st dynamo.Stats) { require.Equal(t, uint64(1), st.Duplicates); require.Zero(t, matchBlocks(ix, c)) }},
		{"a gap is counted and nothing is reset", func() { pub.message(1, 9, dynamo.TopicKVEvents, stored(t, w, 0, b)) },
			func(st dynamo.Stats) {
				require.Equal(t, uint64(1), st.Gaps)
				require.Equal(t, uint64(2), st.Lost)
				require.Equal(t, 2, matchBlocks(ix, a))
				require.Equal(t, 2, matchBlocks(ix, b))
			}},
		{"three frames are malformed", func() { pub.send([][]byte{[]byte("kv-events"), make([]byte, 8), make([]byte, 8)}) },
			func(st dynamo.Stats) { require.Equal(t, uint64(1), st.Malformed) }},
		{"a bad frame version is malformed", func() {
			f := dynamo.AppendZMQ(&dynamo.Envelope{Topic: dynamo.TopicKVEvents, PublisherID: 1, Sequence: 10, Payload: stored(t, w, 0, c)})
			f[3][0] = 2
			pub.send(f)
		}, func(st dynamo.Stats) { require.Equal(t, uint64(2), st.Malformed) }},
		{"a payload that does not decode is malformed", func() { pub.message(1, 10, dynamo.TopicKVEvents, []byte{0x91, 0xc1}) },
			func(st dynamo.Stats) {
				require.Equal(t, uint64(3), st.Malformed)
				require.Equal(t, 2, matchBlocks(ix, a), "valid state kept")
			}},
		{"an unknown parent is refused by the index", func() { pub.message(1, 11, dynamo.TopicKVEvents, stored(t, w, 12345, c)) },
			func(st dynamo.Stats) { require.Equal(t, uint64(1), st.UnknownParents) }},
		{"sequence 0 again is a restart: the worker is reset", func() { pub.message(1, 0, dynamo.TopicKVEvents, stored(t, w, 0, c)) },
			func(st dynamo.Stats) {
				require.Equal(t, uint64(1), st.Restarts)
				require.Zero(t, matchBlocks(ix, a))
				require.Equal(t, 1, matchBlocks(ix, c))
			}},
		{"another publisher has its own sequence", func() { pub.message(2, 40, dynamo.TopicKVEvents, stored(t, kvroute.WorkerKey{ID: 8}, 0, a)) },
			func(st dynamo.Stats) { require.Equal(t, uint64(1), st.Gaps); require.Equal(t, 2, matchBlocks(ix, a)) }},
	}
	for i, s := range steps {
		s.send()
		settle(t, ctx, sub, base.Received+uint64(i)+1)
		st := sub.Stats()
		st.Applied -= base.Applied
		st.Received -= base.Received
		t.Run(s.name, func(t *testing.T) { s.check(st) })
	}
}

// heartbeats records load reports.
type heartbeats struct {
	mu  sync.Mutex
	got []scheduling.Load
	w   []kvroute.WorkerKey
}

func (h *heartbeats) Heartbeat(w kvroute.WorkerKey, l scheduling.Load) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got, h.w = append(h.got, l), append(h.w, w)
	return nil
}

func (h *heartbeats) last() (kvroute.WorkerKey, scheduling.Load, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.got) == 0 {
		return kvroute.WorkerKey{}, scheduling.Load{}, 0
	}
	return h.w[len(h.w)-1], h.got[len(h.got)-1], len(h.got)
}

func TestSubscriberLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pub := newPublisher(t, ctx)
	hb := &heartbeats{}
	sub, err := dynamo.New(dynamo.Config{Load: hb})
	require.NoError(t, err)
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: pub.ep, KVCapacityBlocks: 800, BlockSize: 16,
		MaxRequests: 256, MaxBatchedTokens: 8192}))
	startSubscriber(t, ctx, sub, pub)
	base := sub.Stats().Received
	w := kvroute.WorkerKey{ID: 6285901146321541251}

	fpm := dynamo.ForwardPassMetrics{Version: 1, WorkerID: uint64(w.ID), CounterID: 3,
		Scheduled: dynamo.RequestStats{PrefillRequests: 1, PrefillTokens: 97, DecodeRequests: 2, DecodeKVTokens: 40},
		Queued:    dynamo.RequestStats{PrefillRequests: 3, PrefillTokens: 300}}
	pub.message(5, 0, dynamo.TopicForwardPassMetrics, dynamo.AppendForwardPassMetrics(nil, &fpm))
	settle(t, ctx, sub, base+1)
	gw, l, n := hb.last()
	require.Equal(t, 1, n)
	require.Equal(t, w, gw)
	require.Equal(t, scheduling.Load{ActiveRequests: 3, QueueDepth: 3, ActivePrefillTokens: 397,
		ActiveDecodeBlocks: 3, PotentialDecodeBlocks: 3, KVCapacityBlocks: 800, MaxRequests: 256, MaxBatchedTokens: 8192}, l)

	al := dynamo.ActiveLoad{WorkerID: uint64(w.ID), KVUsedBlocks: dynamo.OptUint{Value: 200, Valid: true},
		ActiveDecodeBlocks: dynamo.OptUint{Value: 9, Valid: true}}
	pub.message(6, 0, dynamo.TopicKVMetrics, dynamo.AppendActiveLoad(nil, &al))
	settle(t, ctx, sub, base+2)
	_, l, n = hb.last()
	require.Equal(t, 2, n)
	require.Equal(t, scheduling.Load{ActiveRequests: 3, QueueDepth: 3, ActivePrefillTokens: 397,
		ActiveDecodeBlocks: 9, PotentialDecodeBlocks: 9, KVUtilization: 0.25, KVCapacityBlocks: 800,
		MaxRequests: 256, MaxBatchedTokens: 8192}, l)

	// kv-events without a Sink are skipped; a malformed report is counted.
	pub.message(7, 0, dynamo.TopicKVEvents, []byte{0x90})
	pub.message(6, 1, dynamo.TopicKVMetrics, []byte{0x80})
	settle(t, ctx, sub, base+4)
	st := sub.Stats()
	require.Equal(t, uint64(1), st.Malformed)
	require.Equal(t, uint64(2), st.LoadReports)
	require.GreaterOrEqual(t, st.Skipped, uint64(1))
}

func TestSubscriberAddRemove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pub := newPublisher(t, ctx)
	ix, err := indexer.New(indexer.Config{Hasher: testHasher})
	require.NoError(t, err)
	sub, err := dynamo.New(dynamo.Config{Sink: ix})
	require.NoError(t, err)
	require.ErrorIs(t, sub.AddPublisher(dynamo.Publisher{}), dynamo.ErrConfig)
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: pub.ep}))
	startSubscriber(t, ctx, sub, pub)
	require.ErrorIs(t, sub.Run(ctx), dynamo.ErrRunning)
	require.Len(t, sub.Publishers(), 1)

	w := kvroute.WorkerKey{ID: 3}
	pub.message(1, 10, dynamo.TopicKVEvents, stored(t, w, 0, tokens(0, 4)))
	waitFor(t, ctx, "the store", func() bool { return matchBlocks(ix, tokens(0, 4)) == 1 }, nil)

	sub.RemovePublisher(pub.ep)
	require.Empty(t, sub.Publishers())
	// Once removed, nothing more is applied; the index is untouched.
	time.Sleep(100 * time.Millisecond)
	pub.message(1, 11, dynamo.TopicKVEvents, stored(t, w, 0, tokens(10, 4)))
	time.Sleep(200 * time.Millisecond)
	require.Zero(t, matchBlocks(ix, tokens(10, 4)))
	require.Equal(t, 1, matchBlocks(ix, tokens(0, 4)))

	// Added again, it starts afresh: a later sequence is no gap.
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: pub.ep}))
	waitFor(t, ctx, "the store after re-adding", func() bool { return matchBlocks(ix, tokens(20, 4)) == 1 },
		func() { pub.message(1, 20, dynamo.TopicKVEvents, stored(t, w, 0, tokens(20, 4))) })
	require.Zero(t, sub.Stats().Gaps)
}

func TestNewConfig(t *testing.T) {
	ix, err := indexer.New(indexer.Config{Hasher: testHasher})
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		cfg  dynamo.Config
		ok   bool
	}{
		{"sink", dynamo.Config{Sink: ix}, true},
		{"load", dynamo.Config{Load: &heartbeats{}}, true},
		{"neither", dynamo.Config{}, false},
		{"negative dial timeout", dynamo.Config{Sink: ix, DialTimeout: -1}, false},
		{"negative idle timeout disables idle reconnects", dynamo.Config{Sink: ix, IdleTimeout: -1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dynamo.New(tc.cfg)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, dynamo.ErrConfig)
			}
		})
	}
}

// TestSubscriberReconnects: a publisher that exits and comes back on the
// same endpoint (a new publisher id, counting from 0) is followed again.
func TestSubscriberReconnects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pub, ix, sub := follow(t, ctx, dynamo.Config{MaxBackoff: 100 * time.Millisecond}, nil)
	w := kvroute.WorkerKey{ID: 4}
	waitFor(t, ctx, "the first store", func() bool { return matchBlocks(ix, tokens(0, 4)) == 1 },
		func() { pub.message(1, 0, dynamo.TopicKVEvents, stored(t, w, 0, tokens(0, 4))) })

	again := pub.restart(ctx)
	waitFor(t, ctx, "a store after the publisher came back", func() bool { return matchBlocks(ix, tokens(10, 4)) == 1 },
		func() { again.message(2, 0, dynamo.TopicKVEvents, stored(t, w, 0, tokens(10, 4))) })
	st := sub.Stats()
	require.GreaterOrEqual(t, st.Reconnects, uint64(2))
	require.Equal(t, 1, matchBlocks(ix, tokens(0, 4)), "nothing reset")
}

// gatedSink is an index whose Apply can be held: while gate is set, each
// Apply signals entered and waits for release. After closed is set, any
// Apply is recorded as late.
type gatedSink struct {
	*indexer.Index
	mu      sync.Mutex
	gate    bool
	entered chan struct{}
	release chan struct{}
	closed  bool
	late    []kvroute.Event
}

func (g *gatedSink) Apply(ev *kvroute.Event) error {
	g.mu.Lock()
	gate, closed := g.gate, g.closed
	if closed {
		g.late = append(g.late, *ev)
	}
	g.gate = false
	g.mu.Unlock()
	if gate {
		g.entered <- struct{}{}
		<-g.release
	}
	return g.Index.Apply(ev)
}

// TestRemovePublisherIsSynchronous: an event being applied when
// RemovePublisher is called holds it until the event is done, and once it
// returns, nothing from the removed endpoint reaches the sink, although
// messages of it were queued and the publisher goes on sending. Each
// round removes the publisher while the sink holds one of its events with
// twenty more queued behind it, then adds it again.
func TestRemovePublisherIsSynchronous(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub, other := newPublisher(t, ctx), newPublisher(t, ctx)
	ix, err := indexer.New(indexer.Config{Hasher: testHasher})
	require.NoError(t, err)
	sink := &gatedSink{Index: ix, entered: make(chan struct{}), release: make(chan struct{})}
	sub, err := dynamo.New(dynamo.Config{Sink: sink})
	require.NoError(t, err)
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: pub.ep}))
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: other.ep}))
	startSubscriber(t, ctx, sub, pub)
	w, ow := kvroute.WorkerKey{ID: 3}, kvroute.WorkerKey{ID: 4}
	for round := range 4 {
		base := 10000 * (round + 1)
		pubID := uint64(round + 1)
		waitFor(t, ctx, "a first store", func() bool { return matchBlocks(ix, tokens(base, 4)) == 1 },
			func() { pub.message(pubID, 0, dynamo.TopicKVEvents, stored(t, w, 0, tokens(base, 4))) })

		// The next store is held inside the sink; more queue behind it.
		sink.mu.Lock()
		sink.gate, sink.closed, sink.late = true, false, nil
		sink.release = make(chan struct{})
		sink.mu.Unlock()
		pub.message(pubID, 1, dynamo.TopicKVEvents, stored(t, w, 0, tokens(base+10, 4)))
		<-sink.entered
		for i := range 20 {
			pub.message(pubID, uint64(2+i), dynamo.TopicKVEvents, stored(t, w, 0, tokens(base+100+10*i, 4)))
		}
		removed := make(chan struct{})
		go func() { sub.RemovePublisher(pub.ep); close(removed) }()
		select {
		case <-removed:
			t.Fatal("RemovePublisher returned while an event of its endpoint was being applied")
		default:
		}
		close(sink.release)
		<-removed
		sink.mu.Lock()
		sink.closed = true
		sink.mu.Unlock()
		for i := range 20 {
			pub.message(pubID, uint64(22+i), dynamo.TopicKVEvents, stored(t, w, 0, tokens(base+400+10*i, 4)))
		}
		// A sentinel from the other publisher: once it is applied, every
		// message queued before it has been handled.
		sentinel := tokens(base+900, 4)
		waitFor(t, ctx, "the other publisher's store", func() bool { return matchBlocks(ix, sentinel) == 1 },
			func() { other.message(pubID, 0, dynamo.TopicKVEvents, stored(t, ow, 0, sentinel)) })
		sink.mu.Lock()
		for _, ev := range sink.late {
			require.Equal(t, ow.ID, ev.Worker.ID, "round %d: an event of the removed endpoint reached the sink: %s", round, ev.String())
		}
		sink.mu.Unlock()
		require.Equal(t, 1, matchBlocks(ix, tokens(base+10, 4)), "the event under way was applied")
		require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: pub.ep}))
	}
}
