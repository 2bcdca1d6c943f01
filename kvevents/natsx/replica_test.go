package natsx_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/natsx"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

const bs = 4

var hasher = kvroute.MustHasher(kvroute.HasherConfig{BlockSize: bs})

// startNATS runs an in-process NATS server on a random loopback port.
func startNATS(t *testing.T) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second), "nats server did not start")
	t.Cleanup(s.Shutdown)
	return s.ClientURL()
}

// connect opens a connection that reconnects for ever, quickly.
func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectJitter(0, 0), nats.Timeout(2*time.Second),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // restarts and proxies break connections on purpose
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// nodeConfig tunes a router replica under test.
type nodeConfig struct {
	ttl, heartbeat, peerTimeout, syncTimeout time.Duration
	removeGrace                              time.Duration // router.Config.RemoveGrace
	// index, when set, wraps the node's index for its replica.
	index func(*indexer.Index) natsx.Index
}

// dumpCounter is an index that counts the dumps it serves.
type dumpCounter struct {
	*indexer.Index
	whole, oneWorker atomic.Int32
}

func (c *dumpCounter) Dump(fn func(*kvroute.Event) error) error {
	c.whole.Add(1)
	return c.Index.Dump(fn)
}

func (c *dumpCounter) DumpWorker(w kvroute.WorkerKey, fn func(*kvroute.Event) error) error {
	c.oneWorker.Add(1)
	return c.Index.DumpWorker(w, fn)
}

func (c nodeConfig) withDefaults() nodeConfig {
	if c.ttl == 0 {
		c.ttl = time.Hour
	}
	if c.heartbeat == 0 {
		c.heartbeat = 50 * time.Millisecond
	}
	if c.syncTimeout == 0 {
		c.syncTimeout = 2 * time.Second
	}
	return c
}

// node is one router replica: a router whose index and tracker a Replica
// keeps in step with the others.
type node struct {
	id      string
	nc      *nats.Conn
	ix      *indexer.Index
	tracker *scheduling.Tracker
	rt      *router.Router
	rep     *natsx.Replica
	cancel  context.CancelFunc
	done    chan error
}

func startNode(t testing.TB, url, id string, cfg nodeConfig, workers ...kvroute.WorkerID) *node {
	t.Helper()
	cfg = cfg.withDefaults()
	ix, err := indexer.New(indexer.Config{Hasher: hasher})
	require.NoError(t, err)
	tr, err := scheduling.NewTracker(scheduling.TrackerConfig{TTL: cfg.ttl, BlockSize: bs})
	require.NoError(t, err)
	n := &node{id: id, nc: connect(t, url), ix: ix, tracker: tr, done: make(chan error, 1)}
	var repIndex natsx.Index = ix
	if cfg.index != nil {
		repIndex = cfg.index(ix)
	}
	n.rep, err = natsx.NewReplica(natsx.ReplicaConfig{Conn: n.nc, ID: id, Index: repIndex, Tracker: tr,
		LoadHeartbeat: cfg.heartbeat, PeerTimeout: cfg.peerTimeout, SyncTimeout: cfg.syncTimeout,
		OnPeerLoad: func() { n.rt.LoadChanged() }})
	require.NoError(t, err)
	n.rt, err = router.New(router.Config{Hasher: hasher, Index: ix, LoadTracker: tr, LoadSync: n.rep,
		Selector: scheduling.SelectorConfig{Seed: 1}, RemoveGrace: cfg.removeGrace})
	require.NoError(t, err)
	for _, w := range workers {
		require.NoError(t, n.rt.AddWorker(router.StaticWorker{WorkerID: w, Block: bs}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() { n.done <- n.rep.Run(ctx) }()
	t.Cleanup(n.stop)
	select {
	case <-n.rep.Ready():
	case <-time.After(20 * time.Second):
		t.Fatalf("replica %s never synced", id)
	}
	return n
}

func (n *node) stop() {
	if n.cancel != nil {
		n.cancel()
		<-n.done
		n.cancel = nil
		n.nc.Close()
	}
}

// blocks returns the sorted sequence hashes n's index holds for w.
func (n *node) blocks(w kvroute.WorkerKey) []kvroute.SeqHash {
	b := n.ix.AppendWorkerBlocks(w, nil)
	slices.Sort(b)
	return b
}

// state is everything two replicas must agree on.
func (n *node) state(workers []kvroute.WorkerKey) string {
	out := ""
	for _, w := range workers {
		out += fmt.Sprintf("%s blocks=%v load=%+v\n", w, n.blocks(w), n.tracker.Load(w))
	}
	return out
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startRelay returns a Publisher on conn with its Serve running, and the
// function that stops Serve (also called at cleanup).
func startRelay(t testing.TB, nc *nats.Conn, replay int) (*natsx.Publisher, func()) {
	t.Helper()
	return startRelayConfig(t, natsx.PublisherConfig{Conn: nc, ReplayEvents: replay, HeadsInterval: 50 * time.Millisecond})
}

// startRelayConfig is startRelay with a Publisher configured by cfg.
func startRelayConfig(t testing.TB, cfg natsx.PublisherConfig) (*natsx.Publisher, func()) {
	t.Helper()
	pub, err := natsx.NewPublisher(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pub.Serve(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return pub, stop
}

// burst publishes n stored/removed events over the workers.
func burst(t *testing.T, pub *natsx.Publisher, rng *rand.Rand, workers []kvroute.WorkerKey,
	held map[kvroute.WorkerKey][]kvroute.ExternalHash, n int) {
	t.Helper()
	for range n {
		w := workers[rng.IntN(len(workers))]
		ev := kvroute.Event{Worker: w}
		if len(held[w]) > 0 && rng.IntN(4) == 0 {
			ev.Kind = kvroute.EventRemoved
			i := rng.IntN(len(held[w]))
			ev.Removed = []kvroute.ExternalHash{held[w][i]}
			held[w] = append(held[w][:i], held[w][i+1:]...)
		} else {
			ev.Kind = kvroute.EventStored
			ext := kvroute.ExternalHash(rng.Uint64())
			ev.Blocks = []kvroute.StoredBlock{{External: ext, Hash: hasher.HashBlock([]uint32{rng.Uint32(), 1, 2, 3})}}
			held[w] = append(held[w], ext)
		}
		require.NoError(t, pub.Apply(&ev))
	}
}

func TestReplicasConvergeAndRestart(t *testing.T) {
	url := startNATS(t)
	pub, _ := startRelay(t, connect(t, url), 0)
	workers := []kvroute.WorkerKey{{ID: 1}, {ID: 2}, {ID: 2, Rank: 1}}
	held := map[kvroute.WorkerKey][]kvroute.ExternalHash{}
	rng := rand.New(rand.NewPCG(3, 4))

	a := startNode(t, url, "router-a", nodeConfig{}, 1, 2)
	b := startNode(t, url, "router-b", nodeConfig{}, 1, 2)
	burst(t, pub, rng, workers, held, 2000)
	eventually(t, "a and b to converge", func() bool {
		return a.state(workers) == b.state(workers) && a.rep.Stats().Applied >= 2000
	})
	require.Zero(t, a.rep.Stats().Gaps)

	// A replica that restarts rebuilds everything from a peer's dump, and
	// then follows the stream with the others.
	b.stop()
	burst(t, pub, rng, workers, held, 500)
	c := startNode(t, url, "router-b", nodeConfig{}, 1, 2)
	require.Positive(t, a.rep.Stats().DumpsServed)
	burst(t, pub, rng, workers, held, 500)
	complete := func(n *node) bool {
		for _, w := range workers {
			if len(n.blocks(w)) != len(held[w]) {
				return false
			}
		}
		return true
	}
	eventually(t, "the restarted replica to converge", func() bool {
		return complete(a) && complete(c) && c.state(workers) == a.state(workers)
	})
	require.Zero(t, c.rep.Stats().Resets)
}

// Two routers route known loads; each one's tracker counts every request
// of both exactly once, and both empty when the requests end.
func TestTwoRoutersShareLoadOnce(t *testing.T) {
	url := startNATS(t)
	a := startNode(t, url, "a", nodeConfig{}, 1, 2)
	b := startNode(t, url, "b", nodeConfig{}, 1, 2)
	w1, w2 := kvroute.WorkerKey{ID: 1}, kvroute.WorkerKey{ID: 2}
	ctx := context.Background()
	prompt := func(i int) []uint32 {
		out := make([]uint32, 4*bs) // 4 blocks, 16 prefill tokens
		for j := range out {
			out[j] = uint32(1000*i + j)
		}
		return out
	}
	var decisions []*router.Decision
	route := func(n *node, w kvroute.WorkerKey, i int) {
		d, err := n.rt.Select(ctx, &router.Request{Tokens: prompt(i), Pin: w, HasPin: true})
		require.NoError(t, err)
		decisions = append(decisions, d)
	}
	for i := range 3 {
		route(a, w1, i)
	}
	route(b, w1, 10)
	route(b, w1, 11)
	route(b, w2, 12)
	want := map[kvroute.WorkerKey]scheduling.WorkerLoad{
		w1: {ActiveRequests: 5, ActivePrefillTokens: 5 * 16, ActiveBlocks: 5 * 4},
		w2: {ActiveRequests: 1, ActivePrefillTokens: 16, ActiveBlocks: 4},
	}
	for _, n := range []*node{a, b} {
		eventually(t, n.id+" to see both routers' load", func() bool {
			return n.tracker.Load(w1) == want[w1] && n.tracker.Load(w2) == want[w2]
		})
	}
	// Select sees the shared load: an unpinned request avoids worker 1.
	d, err := a.rt.Select(ctx, &router.Request{Tokens: prompt(99), Explain: true})
	require.NoError(t, err)
	require.Equal(t, w2, d.Worker)
	for _, c := range d.Candidates {
		require.Equal(t, want[c.Worker].ActivePrefillTokens, c.Load.ActivePrefillTokens, "%s", c.Worker)
	}
	d.Done(router.Outcome{})
	for _, d := range decisions {
		d.PrefillDone()
		d.AddOutputTokens(2 * bs)
	}
	for _, n := range []*node{a, b} {
		eventually(t, n.id+" to see the prefills done and the output", func() bool {
			l := n.tracker.Load(w1)
			return l.ActivePrefillTokens == 0 && l.ActiveRequests == 5 && l.ActiveBlocks == 5*4+5*2
		})
	}
	for _, d := range decisions {
		d.Done(router.Outcome{})
	}
	for _, n := range []*node{a, b} {
		eventually(t, n.id+" to drain", func() bool { return n.tracker.Len() == 0 })
	}
}

// dropEvent returns a drop function for the proxy that drops the event
// messages of worker w with the given IDs.
func dropEvent(w kvroute.WorkerKey, ids ...uint64) dropFunc {
	return func(subject string, payload []byte, toClient bool) bool {
		if subject != natsx.DefaultPrefix+".events" {
			return false
		}
		var d kvevents.DynamoEvent
		if _, err := kvevents.DecodeDynamoEvent(payload, &d); err != nil {
			return false
		}
		return kvroute.WorkerID(d.WorkerID) == w.ID && slices.Contains(ids, d.EventID+1)
	}
}

// A gap on one worker repairs that worker only: from a peer, else the
// relay's replay, else a reset of that worker alone; the event that
// revealed the gap is applied after the repair.
func TestGapRepairsOnlyThatWorker(t *testing.T) {
	w1, w2 := kvroute.WorkerKey{ID: 1}, kvroute.WorkerKey{ID: 2}
	tests := []struct {
		name        string
		replay      int  // Publisher.ReplayEvents
		peer        bool // a second replica that saw everything
		tail        bool // the lost event is the last one
		wantBlocks1 int
		want        func(natsx.ReplicaStats) uint64
	}{
		{"peer dump", -1, true, false, 7, func(s natsx.ReplicaStats) uint64 { return s.ByDump }},
		{"relay replay", 0, false, false, 7, func(s natsx.ReplicaStats) uint64 { return s.ByReplay }},
		{"reset of that worker", -1, false, false, 1, func(s natsx.ReplicaStats) uint64 { return s.Resets }},
		{"tail loss found by the heads", 0, false, true, 6, func(s natsx.ReplicaStats) uint64 { return s.ByReplay }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := startNATS(t)
			proxy := startProxy(t, url[len("nats://"):])
			proxy.setDrop(dropEvent(w1, 6))
			x := startNode(t, proxy.URL(), "x", nodeConfig{syncTimeout: time.Second}, 1, 2)
			var y *node
			peerIndex := &dumpCounter{}
			if tt.peer {
				y = startNode(t, url, "y", nodeConfig{syncTimeout: time.Second, index: func(ix *indexer.Index) natsx.Index {
					peerIndex.Index = ix
					return peerIndex
				}}, 1, 2)
			}
			pub, _ := startRelay(t, connect(t, url), tt.replay)
			store := func(w kvroute.WorkerKey, i uint32) {
				ev := kvroute.Event{Kind: kvroute.EventStored, Worker: w,
					Blocks: []kvroute.StoredBlock{{External: kvroute.ExternalHash(i), Hash: hasher.HashBlock([]uint32{i, 1, 2, 3})}}}
				require.NoError(t, pub.Apply(&ev))
			}
			for i := range uint32(5) {
				store(w1, 10+i)
				store(w2, 20+i)
			}
			eventually(t, "5 blocks each", func() bool { return len(x.blocks(w1)) == 5 && len(x.blocks(w2)) == 5 })
			if y != nil {
				eventually(t, "the peer", func() bool { return len(y.blocks(w1)) == 5 && len(y.blocks(w2)) == 5 })
			}
			store(w1, 15) // event 6: lost on the way to x
			if !tt.tail {
				store(w1, 16) // event 7 reveals the gap
			}
			eventually(t, "the repair", func() bool { return tt.want(x.rep.Stats()) == 1 })
			eventually(t, "worker 1's blocks", func() bool { return len(x.blocks(w1)) == tt.wantBlocks1 })
			require.Len(t, x.blocks(w2), 5, "the other worker was touched")
			st := x.rep.Stats()
			require.Equal(t, uint64(1), st.ByDump+st.ByReplay+st.Resets, "%+v", st)
			require.Positive(t, proxy.dropped.Load())
			if y != nil {
				require.Equal(t, y.blocks(w1), x.blocks(w1))
				// The peer dumped worker 1 alone, not its whole index.
				require.Zero(t, peerIndex.whole.Load())
				require.Equal(t, int32(1), peerIndex.oneWorker.Load())
			}
		})
	}
}

// A peer that stops without freeing its requests has them dropped after
// PeerTimeout; a joining replica gets each request with the time it has
// left, not a fresh TTL; a router's expired requests leave every replica.
func TestPeerRequestsAreBounded(t *testing.T) {
	url := startNATS(t)
	w := kvroute.WorkerKey{ID: 1}
	cfg := nodeConfig{ttl: 8 * time.Second, heartbeat: 50 * time.Millisecond, peerTimeout: 500 * time.Millisecond}
	a := startNode(t, url, "a", cfg, 1)
	b := startNode(t, url, "b", cfg, 1)
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	start := time.Now()
	_, err := a.rt.Select(context.Background(), &router.Request{Tokens: tokens}) // never Done
	require.NoError(t, err)
	eventually(t, "b to see a's request", func() bool { return b.tracker.Load(w).ActiveRequests == 1 })

	// c joins half way through the request's TTL.
	time.Sleep(time.Until(start.Add(cfg.ttl / 2)))
	c := startNode(t, url, "c", cfg, 1)
	eventually(t, "c to see a's request", func() bool { return c.tracker.Load(w).ActiveRequests == 1 })
	joined := time.Now() // a fresh TTL would keep it on c until joined + ttl
	// a's own tracker expires it (the host's CheckHealth), and the
	// replicas drop it on the same TTL.
	for _, n := range []*node{a, b, c} {
		eventually(t, n.id+" to drop the expired request", func() bool {
			a.rt.CheckHealth()
			return n.tracker.Len() == 0
		})
	}
	require.Less(t, time.Since(start), joined.Sub(start)+cfg.ttl-cfg.ttl/8, "a fresh TTL on joining")

	// A router that dies with a request in flight: its peers drop it.
	_, err = a.rt.Select(context.Background(), &router.Request{Tokens: tokens})
	require.NoError(t, err)
	eventually(t, "b and c to see the request", func() bool {
		return b.tracker.Len() == 1 && c.tracker.Len() == 1
	})
	a.stop()
	for _, n := range []*node{b, c} {
		eventually(t, n.id+" to drop the dead peer's request", func() bool { return n.tracker.Len() == 0 })
		require.Positive(t, n.rep.Stats().PeerDrops)
	}
}

func TestLocalIDAndConfig(t *testing.T) {
	require.Equal(t, natsx.LocalID("a", 1), natsx.LocalID("a", 1))
	require.NotEqual(t, natsx.LocalID("a", 1), natsx.LocalID("b", 1))
	require.NotEqual(t, natsx.LocalID("a", 1), natsx.LocalID("a", 2))
	_, err := natsx.NewPublisher(natsx.PublisherConfig{})
	require.ErrorIs(t, err, natsx.ErrConfig)
	ix, err := indexer.New(indexer.Config{})
	require.NoError(t, err)
	for _, cfg := range []natsx.ReplicaConfig{
		{ID: "x", Index: ix}, {Conn: &nats.Conn{}, Index: ix}, {Conn: &nats.Conn{}, ID: "x"},
		{Conn: &nats.Conn{}, ID: "a.b", Index: ix}, {Conn: &nats.Conn{}, ID: "x", Index: ix, PeerTimeout: -1},
	} {
		_, err := natsx.NewReplica(cfg)
		require.ErrorIs(t, err, natsx.ErrConfig)
	}
}

// A relay that restarts numbers its workers' events from 1 again, after a
// new-sequence marker; replicas apply the new sequence, not drop it as
// duplicates of the old one, also when they miss the marker (the new
// Publisher's heads tell). A reset of a worker later on is an event of its
// sequence.
func TestReplicaFollowsARestartedRelay(t *testing.T) {
	url := startNATS(t)
	proxy := startProxy(t, url[len("nats://"):])
	a := startNode(t, proxy.URL(), "a", nodeConfig{syncTimeout: time.Second}, 3)
	w := kvroute.WorkerKey{ID: 3}
	store := func(pub *natsx.Publisher, ext kvroute.ExternalHash, tok uint32) {
		ev := kvroute.Event{Kind: kvroute.EventStored, Worker: w, ID: 99,
			Blocks: []kvroute.StoredBlock{{External: ext, Hash: hasher.HashBlock([]uint32{tok, 1, 2, 3})}}}
		require.NoError(t, pub.Apply(&ev))
	}
	pub, stop := startRelay(t, connect(t, url), 0)
	for id := range uint32(5) {
		store(pub, kvroute.ExternalHash(id), id)
	}
	eventually(t, "the first sequence", func() bool { return len(a.blocks(w)) == 5 })
	pub.ResetWorker(w)
	store(pub, 50, 50)
	eventually(t, "the reset", func() bool { return len(a.blocks(w)) == 1 })
	time.Sleep(200 * time.Millisecond) // the replica hears this Publisher's heads

	// The relay restarts: marker, then IDs from 1.
	stop()
	pub2, stop2 := startRelay(t, connect(t, url), 0)
	store(pub2, 101, 101)
	store(pub2, 102, 102)
	eventually(t, "the new sequence", func() bool { return len(a.blocks(w)) == 2 })
	time.Sleep(200 * time.Millisecond)

	// It restarts again, and the replica misses the marker.
	stop2()
	proxy.setDrop(dropEvent(w, 0))
	pub3, _ := startRelay(t, connect(t, url), 0)
	store(pub3, 201, 201)
	store(pub3, 202, 202)
	store(pub3, 203, 203)
	eventually(t, "the sequence after the missed marker", func() bool {
		b := a.blocks(w)
		return len(b) == 3 && slices.Contains(b, kvroute.SeqHash(hasher.HashBlock([]uint32{201, 1, 2, 3})))
	})
	require.Positive(t, proxy.dropped.Load())
	require.Zero(t, a.rep.Stats().Resets)
}

// A worker removed from every router while its engine keeps its cache:
// with RemoveGrace, the replicas keep its blocks and go on applying its
// events, so that a worker added again within the grace has its whole
// cache in every index; one that does not come back has its blocks
// removed when the grace passes.
func TestRemovedWorkerKeepsItsBlocks(t *testing.T) {
	tests := []struct {
		name       string
		grace      time.Duration
		addAgain   bool
		wait       time.Duration // after the removal, before the checks
		wantBlocks int
	}{
		{"added again within the grace", time.Minute, true, 0, 7},
		{"not added again", 100 * time.Millisecond, false, 150 * time.Millisecond, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := startNATS(t)
			cfg := nodeConfig{removeGrace: tt.grace}
			nodes := []*node{startNode(t, url, "a", cfg, 1, 2), startNode(t, url, "b", cfg, 1, 2)}
			pub, _ := startRelay(t, connect(t, url), 0)
			w := kvroute.WorkerKey{ID: 1}
			store := func(i uint32) {
				ev := kvroute.Event{Kind: kvroute.EventStored, Worker: w,
					Blocks: []kvroute.StoredBlock{{External: kvroute.ExternalHash(i), Hash: hasher.HashBlock([]uint32{i, 1, 2, 3})}}}
				require.NoError(t, pub.Apply(&ev))
			}
			for i := range uint32(5) {
				store(i)
			}
			for _, n := range nodes {
				eventually(t, n.id+" to hold 5 blocks", func() bool { return len(n.blocks(w)) == 5 })
				require.True(t, n.rt.RemoveWorker(w.ID))
			}
			store(5) // the engine's requests in flight finish meanwhile
			store(6)
			for _, n := range nodes {
				eventually(t, n.id+" to apply the events after the removal", func() bool { return len(n.blocks(w)) == 7 })
			}
			for _, n := range nodes {
				if tt.addAgain {
					require.NoError(t, n.rt.AddWorker(router.StaticWorker{WorkerID: w.ID, Block: bs}))
				}
			}
			time.Sleep(tt.wait)
			for _, n := range nodes {
				n.rt.CheckHealth() // the housekeeping that ends a grace
				require.Len(t, n.blocks(w), tt.wantBlocks, n.id)
				require.Zero(t, n.rep.Stats().Gaps, n.id)
			}
		})
	}
}

// storeBlock applies a Stored event of one root block, token tok, of w to
// sink (a Publisher, or an index).
func storeBlock(t testing.TB, sink interface{ Apply(*kvroute.Event) error }, w kvroute.WorkerKey, tok uint32) {
	t.Helper()
	ev := kvroute.Event{Kind: kvroute.EventStored, Worker: w,
		Blocks: []kvroute.StoredBlock{{External: kvroute.ExternalHash(tok), Hash: hasher.HashBlock([]uint32{tok, 1, 2, 3})}}}
	require.NoError(t, sink.Apply(&ev))
}

// seqHashes returns the sorted sequence hashes of root blocks of tokens toks.
func seqHashes(toks ...uint32) []kvroute.SeqHash {
	var out []kvroute.SeqHash
	for _, tok := range toks {
		out = append(out, kvroute.SeqHash(hasher.HashBlock([]uint32{tok, 1, 2, 3})))
	}
	slices.Sort(out)
	return out
}

// A replica that joins from a peer still on a relay's old sequence (the
// peer missed the restarted relay's marker and has not heard its heads
// yet) gets the old relay's epoch with the dump: the new relay's heads
// then tell both that they are on the wrong sequence, and neither takes
// the other's stale dump as a repair.
func TestDumpCarriesTheRelayEpoch(t *testing.T) {
	url := startNATS(t)
	proxy := startProxy(t, url[len("nats://"):])
	w := kvroute.WorkerKey{ID: 3}
	cfg := nodeConfig{syncTimeout: time.Second}
	p := startNode(t, proxy.URL(), "p", cfg, 3)
	pub1, stop1 := startRelay(t, connect(t, url), 0)
	for tok := range uint32(5) {
		storeBlock(t, pub1, w, tok)
	}
	eventually(t, "p to hold the first sequence", func() bool { return len(p.blocks(w)) == 5 })
	time.Sleep(200 * time.Millisecond) // p hears pub1's heads

	stop1()
	proxy.setDrop(dropEvent(w, 0)) // p misses the restart marker
	pub2, _ := startRelayConfig(t, natsx.PublisherConfig{Conn: connect(t, url), HeadsInterval: 2 * time.Second})
	events := p.rep.Stats().Events
	storeBlock(t, pub2, w, 101) // event 1 of the new sequence
	storeBlock(t, pub2, w, 102) // event 2
	eventually(t, "p to drop the new events as duplicates", func() bool { return p.rep.Stats().Events >= events+2 })
	require.Len(t, p.blocks(w), 5)

	j := startNode(t, url, "j", cfg, 3) // from p's stale dump
	time.Sleep(2500 * time.Millisecond) // pub2's heads reach both
	storeBlock(t, pub2, w, 103)
	want := seqHashes(101, 102, 103)
	for _, n := range []*node{j, p} {
		eventually(t, n.id+" to follow the new sequence", func() bool { return slices.Equal(n.blocks(w), want) })
	}
}

// A Replica run again after Run returned starts from a peer's dump, not
// from the dump on top of what it held before: blocks removed while it
// was down leave its index, and the next live event follows the dump
// without a reset.
func TestRunAgainStartsFromTheDump(t *testing.T) {
	url := startNATS(t)
	w := kvroute.WorkerKey{ID: 1}
	a := startNode(t, url, "a", nodeConfig{}, 1)
	b := startNode(t, url, "b", nodeConfig{}, 1)
	pub, _ := startRelay(t, connect(t, url), 0)
	for tok := range uint32(5) {
		storeBlock(t, pub, w, tok)
	}
	for _, n := range []*node{a, b} {
		eventually(t, n.id+" to hold 5 blocks", func() bool { return len(n.blocks(w)) == 5 })
	}

	b.cancel()
	require.NoError(t, <-b.done)
	require.NoError(t, pub.Apply(&kvroute.Event{Kind: kvroute.EventRemoved, Worker: w, Removed: []kvroute.ExternalHash{0}}))
	storeBlock(t, pub, w, 5)
	eventually(t, "a to apply the events b missed", func() bool { return slices.Equal(a.blocks(w), seqHashes(1, 2, 3, 4, 5)) })

	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	go func() { b.done <- b.rep.Run(ctx) }()
	time.Sleep(200 * time.Millisecond)
	storeBlock(t, pub, w, 6)
	want := seqHashes(1, 2, 3, 4, 5, 6)
	eventually(t, "a to apply the last event", func() bool { return slices.Equal(a.blocks(w), want) })
	eventually(t, "b to match a", func() bool { return slices.Equal(b.blocks(w), want) })
	require.Zero(t, b.rep.Stats().Resets)
}

// Load messages stay under NATS's payload limit however many blocks the
// requests hold: a joining replica gets every request of a peer whose
// requests would not fit one message by count alone.
func TestLargeLoadFitsThePayloadLimit(t *testing.T) {
	url := startNATS(t)
	w := kvroute.WorkerKey{ID: 1}
	a := startNode(t, url, "a", nodeConfig{}, 1)
	const requests, blocksEach = 300, 1000
	for id := range scheduling.RequestID(requests) {
		blocks := make([]kvroute.SeqHash, blocksEach)
		for i := range blocks {
			blocks[i] = kvroute.SeqHash(uint64(id+1)<<32 | uint64(i) | 1<<63)
		}
		a.rep.Added(id+1, w, blocks, 16000)
	}
	b := startNode(t, url, "b", nodeConfig{}, 1)
	eventually(t, "b to hold every request of a", func() bool { return b.tracker.Len() == requests })
}

// A dump stays under NATS's payload limit whatever the index holds: a
// worker whose long chain lost its ancestors is dumped with one
// placeholder per ancestor, more than one message would hold, and a
// joining replica still loads it exactly.
func TestLargeDumpFitsThePayloadLimit(t *testing.T) {
	url := startNATS(t)
	w := kvroute.WorkerKey{ID: 1}
	a := startNode(t, url, "a", nodeConfig{}, 1)
	const chain = 130_000 // 9 bytes a placeholder: over 1 MB
	blocks := make([]kvroute.StoredBlock, chain)
	evicted := make([]kvroute.ExternalHash, 0, chain)
	for i := range blocks {
		blocks[i] = kvroute.StoredBlock{External: kvroute.ExternalHash(1<<40 + i), Hash: kvroute.BlockHash(1<<40 + 7*i)}
		if i < chain-1 {
			evicted = append(evicted, blocks[i].External)
		}
	}
	require.NoError(t, a.ix.Apply(&kvroute.Event{Kind: kvroute.EventStored, Worker: w, Blocks: blocks}))
	require.NoError(t, a.ix.Apply(&kvroute.Event{Kind: kvroute.EventRemoved, Worker: w, Removed: evicted}))
	storeBlock(t, a.ix, w, 1) // a short chain beside it
	require.Len(t, a.blocks(w), 2)

	// The dump takes seconds under the race detector on a busy machine:
	// b waits for it as long as it takes (not the default 2 s).
	b := startNode(t, url, "b", nodeConfig{syncTimeout: time.Minute}, 1)
	require.Equal(t, a.blocks(w), b.blocks(w))
	require.Positive(t, a.rep.Stats().DumpsServed)
}

// A replica whose sequence of a worker is of a relay it does not know (it
// missed the marker, and no heads came) does not take itself for in sync
// when a restarted relay's heads arrive, though its last event ID is past
// theirs: it starts the worker over from the new relay's first event
// (here from the relay's replay) instead of keeping the old sequence's
// blocks and dropping the new one's events as duplicates.
func TestUnknownRelayEpochIsNotInSync(t *testing.T) {
	url := startNATS(t)
	proxy := startProxy(t, url[len("nats://"):])
	w := kvroute.WorkerKey{ID: 3}
	p := startNode(t, proxy.URL(), "p", nodeConfig{syncTimeout: 500 * time.Millisecond}, 3)
	proxy.setDrop(dropEvent(w, 0)) // p misses every marker
	pub1, stop1 := startRelayConfig(t, natsx.PublisherConfig{Conn: connect(t, url), HeadsInterval: time.Hour})
	for tok := range uint32(5) {
		storeBlock(t, pub1, w, tok)
	}
	eventually(t, "p to hold the first sequence", func() bool { return len(p.blocks(w)) == 5 })

	stop1()
	pub2, _ := startRelayConfig(t, natsx.PublisherConfig{Conn: connect(t, url), HeadsInterval: 500 * time.Millisecond})
	events := p.rep.Stats().Events
	storeBlock(t, pub2, w, 101) // event 1 of the new sequence
	storeBlock(t, pub2, w, 102) // event 2
	eventually(t, "p to get the new events", func() bool { return p.rep.Stats().Events >= events+2 })
	want := seqHashes(101, 102)
	eventually(t, "p to start over on the new relay's heads", func() bool { return slices.Equal(p.blocks(w), want) })
	storeBlock(t, pub2, w, 103)
	want = seqHashes(101, 102, 103)
	eventually(t, "p to follow the new sequence", func() bool { return slices.Equal(p.blocks(w), want) })
	st := p.rep.Stats()
	require.Positive(t, st.ByReplay)
	require.Zero(t, st.Resets)
	require.Positive(t, proxy.dropped.Load())
}

// A replica that lost a worker's events across a reset of the worker
// repairs from the relay's replay, which starts at the reset (the relay
// keeps nothing from before it): it ends with exactly the blocks stored
// after the reset, without resetting the worker itself.
func TestReplayAcrossAResetStartsAtTheReset(t *testing.T) {
	url := startNATS(t)
	proxy := startProxy(t, url[len("nats://"):])
	w := kvroute.WorkerKey{ID: 1}
	x := startNode(t, proxy.URL(), "x", nodeConfig{syncTimeout: 500 * time.Millisecond}, 1)
	pub, _ := startRelay(t, connect(t, url), 0)
	for tok := range uint32(3) {
		storeBlock(t, pub, w, tok) // events 1..3
	}
	eventually(t, "x to hold 3 blocks", func() bool { return len(x.blocks(w)) == 3 })
	proxy.setDrop(dropEvent(w, 4, 5, 6))
	storeBlock(t, pub, w, 3) // event 4, lost
	pub.ResetWorker(w)       // event 5, lost
	storeBlock(t, pub, w, 5) // event 6, lost
	storeBlock(t, pub, w, 6) // event 7 reveals the gap
	want := seqHashes(5, 6)
	eventually(t, "x to repair across the reset", func() bool { return slices.Equal(x.blocks(w), want) })
	st := x.rep.Stats()
	require.Equal(t, uint64(1), st.ByReplay)
	require.Zero(t, st.Resets)
	require.Zero(t, st.Malformed)
	require.Equal(t, uint64(3), proxy.dropped.Load())
}
