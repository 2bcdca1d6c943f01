package natsx_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents/natsx"
	"github.com/kvroute/kvroute/scheduling"
)

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

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// node is one router replica under test.
type node struct {
	ix      *indexer.Index
	tracker *scheduling.Tracker
	rep     *natsx.Replica
	cancel  context.CancelFunc
	done    chan error
}

func startNode(t *testing.T, url, id string) *node {
	t.Helper()
	ix, err := indexer.New(indexer.Config{})
	require.NoError(t, err)
	tr, err := scheduling.NewTracker(scheduling.TrackerConfig{TTL: time.Hour})
	require.NoError(t, err)
	rep, err := natsx.NewReplica(natsx.ReplicaConfig{Conn: connect(t, url), ID: id, Index: ix, Tracker: tr,
		SyncTimeout: 2 * time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{ix: ix, tracker: tr, rep: rep, cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- rep.Run(ctx) }()
	t.Cleanup(n.stop)
	select {
	case <-rep.Ready():
	case <-time.After(10 * time.Second):
		t.Fatalf("replica %s never synced", id)
	}
	return n
}

func (n *node) stop() {
	if n.cancel != nil {
		n.cancel()
		<-n.done
		n.cancel = nil
	}
}

// state is everything two replicas must agree on.
func (n *node) state(workers []kvroute.WorkerKey) string {
	out := ""
	for _, w := range workers {
		blocks := n.ix.AppendWorkerBlocks(w, nil)
		slices.Sort(blocks)
		last, _ := n.ix.LastEventID(w)
		out += fmt.Sprintf("%s last=%d blocks=%v load=%+v\n", w, last, blocks, n.tracker.Load(w))
	}
	return out
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// burst publishes n stored/removed events over the workers, numbered per
// worker from next.
func burst(t *testing.T, pub *natsx.Publisher, rng *rand.Rand, workers []kvroute.WorkerKey, next map[kvroute.WorkerKey]uint64,
	held map[kvroute.WorkerKey][]kvroute.ExternalHash, n int) {
	t.Helper()
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	for range n {
		w := workers[rng.IntN(len(workers))]
		next[w]++
		ev := kvroute.Event{Worker: w, ID: next[w]}
		if len(held[w]) > 0 && rng.IntN(4) == 0 {
			ev.Kind = kvroute.EventRemoved
			i := rng.IntN(len(held[w]))
			ev.Removed = []kvroute.ExternalHash{held[w][i]}
			held[w] = append(held[w][:i], held[w][i+1:]...)
		} else {
			ev.Kind = kvroute.EventStored
			ext := kvroute.ExternalHash(rng.Uint64())
			ev.Blocks = []kvroute.StoredBlock{{External: ext, Hash: h.HashBlock([]uint32{rng.Uint32(), 1, 2, 3})}}
			held[w] = append(held[w], ext)
		}
		require.NoError(t, pub.Apply(&ev))
	}
}

func TestReplicasConvergeAndRestart(t *testing.T) {
	url := startNATS(t)
	pubConn := connect(t, url)
	pub, err := natsx.NewPublisher(natsx.PublisherConfig{Conn: pubConn})
	require.NoError(t, err)
	workers := []kvroute.WorkerKey{{ID: 1}, {ID: 2}, {ID: 2, Rank: 1}}
	next := map[kvroute.WorkerKey]uint64{}
	held := map[kvroute.WorkerKey][]kvroute.ExternalHash{}
	rng := rand.New(rand.NewPCG(3, 4))

	a := startNode(t, url, "router-a")
	b := startNode(t, url, "router-b")

	// A burst of events and routing decisions on both replicas.
	burst(t, pub, rng, workers, next, held, 2000)
	for i := range 300 {
		n, id := a, scheduling.RequestID(i)
		if i%2 == 1 {
			n = b // the same request ids on both routers: they must not collide
			id = scheduling.RequestID(i - 1)
		}
		w := workers[i%len(workers)]
		require.NoError(t, n.rep.Add(id, w, []kvroute.SeqHash{kvroute.SeqHash(i), kvroute.SeqHash(i + 1)}, 64))
		if i%3 == 0 {
			require.True(t, n.rep.PrefillDone(id), "request %d", i)
		}
		if i%5 == 0 {
			require.True(t, n.rep.Free(id))
		}
	}
	want := func() string { return a.state(workers) }
	eventually(t, "a and b to converge", func() bool {
		return a.state(workers) == b.state(workers) && a.rep.Stats().Applied == 2000
	})
	require.Equal(t, 300-60, a.tracker.Len())
	require.Zero(t, a.rep.Stats().Gaps)

	// A replica that restarts rebuilds everything from a peer's dump, and
	// then follows the stream with the others.
	b.stop()
	burst(t, pub, rng, workers, next, held, 500)
	c := startNode(t, url, "router-b")
	require.Positive(t, a.rep.Stats().DumpsServed)
	burst(t, pub, rng, workers, next, held, 500)
	require.True(t, a.rep.Free(2))
	eventually(t, "the restarted replica to converge", func() bool { return c.state(workers) == want() })
	for _, w := range workers {
		last, _ := c.ix.LastEventID(w)
		require.Equal(t, next[w], last)
	}
	require.Equal(t, a.tracker.Len(), c.tracker.Len())
}

func TestLocalIDAndConfig(t *testing.T) {
	require.Equal(t, natsx.LocalID("a", 1), natsx.LocalID("a", 1))
	require.NotEqual(t, natsx.LocalID("a", 1), natsx.LocalID("b", 1))
	require.NotEqual(t, natsx.LocalID("a", 1), natsx.LocalID("a", 2))
	_, err := natsx.NewPublisher(natsx.PublisherConfig{})
	require.ErrorIs(t, err, natsx.ErrConfig)
	ix, err := indexer.New(indexer.Config{})
	require.NoError(t, err)
	for _, cfg := range []natsx.ReplicaConfig{{ID: "x", Index: ix}, {Conn: &nats.Conn{}, Index: ix}, {Conn: &nats.Conn{}, ID: "x"}} {
		_, err := natsx.NewReplica(cfg)
		require.ErrorIs(t, err, natsx.ErrConfig)
	}
}

// A relay that restarts numbers its workers' events from 1 again, after a
// reset marker; replicas must apply the new sequence, not drop it as
// duplicates of the old one.
func TestReplicaFollowsARestartedRelay(t *testing.T) {
	url := startNATS(t)
	a := startNode(t, url, "a")
	pubConn := connect(t, url)
	pub, err := natsx.NewPublisher(natsx.PublisherConfig{Conn: pubConn})
	require.NoError(t, err)
	w := kvroute.WorkerKey{ID: 3}
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	store := func(id uint64, ext kvroute.ExternalHash, tok uint32) {
		ev := kvroute.Event{Kind: kvroute.EventStored, Worker: w, ID: id,
			Blocks: []kvroute.StoredBlock{{External: ext, Hash: h.HashBlock([]uint32{tok, 1, 2, 3})}}}
		require.NoError(t, pub.Apply(&ev))
	}
	for id := uint64(1); id <= 5; id++ {
		store(id, kvroute.ExternalHash(id), uint32(id))
	}
	require.NoError(t, pubConn.Flush())
	eventually(t, "the first sequence", func() bool { last, _ := a.ix.LastEventID(w); return last == 5 })

	// The relay restarts: reset marker, then IDs from 1.
	pub.ResetWorker(w)
	store(1, 101, 101)
	store(2, 102, 102)
	require.NoError(t, pubConn.Flush())
	eventually(t, "the new sequence", func() bool { last, ok := a.ix.LastEventID(w); return ok && last == 2 })
	require.Len(t, a.ix.AppendWorkerBlocks(w, nil), 2, "the reset dropped the old blocks")
}
