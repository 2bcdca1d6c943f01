package dynamo_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/dynamo"
	kvdynamo "github.com/kvroute/kvroute/kvevents/dynamo"
	"github.com/kvroute/kvroute/router"
)

// startRankState is the captured store of a worker serving two
// data-parallel ranks (testdata/filestore-dp2), edited as Dynamo records
// the second node of a multi-node data-parallel deployment: its card's
// data_parallel_start_rank is 2 and its kv-events sources speak for
// ranks 2 and 3.
func startRankState(t *testing.T) *dynamo.State {
	t.Helper()
	var st dynamo.State
	edited := 0
	for _, f := range goldenFilesIn(t, "filestore-dp2") {
		v := string(f.value)
		switch {
		case f.rec.Model != nil:
			v = strings.Replace(v, `"data_parallel_start_rank":0`, `"data_parallel_start_rank":2`, 1)
		case f.rec.Source != nil:
			v = strings.Replace(v, `"dp_rank":1}`, `"dp_rank":3}`, 1)
			v = strings.Replace(v, `"dp_rank":0}`, `"dp_rank":2}`, 1)
		}
		if v != string(f.value) {
			edited++
		}
		require.NoError(t, st.Put(f.key, []byte(v), 0))
	}
	require.Equal(t, 3, edited, "the card and both sources")
	return &st
}

func TestStartRankWorker(t *testing.T) {
	d := startRankState(t).Deployment(dynamo.Selector{})
	require.Empty(t, d.Waiting)
	require.Len(t, d.Workers, 1)
	w := d.Workers[0]
	require.Equal(t, 2, w.DPStart)
	require.Equal(t, 2, w.DPSize)
	require.Len(t, w.KVEvents, 2)
	require.Equal(t, 2, w.KVEvents[0].DPRank, "Dynamo's ranks")
	require.Equal(t, 3, w.KVEvents[1].DPRank)
	require.Equal(t, map[uint64]int{w.InstanceID: 2}, dynamo.StartRanks(d))

	e := w.Engine()
	require.Equal(t, 2, e.Ranks)
	require.Len(t, e.DynamoEvents, 2)
	require.Equal(t, 0, e.DynamoEvents[0].Rank, "the router's ranks")
	require.Equal(t, 1, e.DynamoEvents[1].Rank)
	require.NoError(t, e.Validate())

	// A source of a rank the worker does not serve is not its publisher.
	st := startRankState(t)
	for _, f := range goldenFilesIn(t, "filestore-dp2") {
		if f.rec.Source != nil && strings.Contains(string(f.value), `"dp_rank":1}`) {
			require.NoError(t, st.Put(f.key, f.value, 0)) // rank 1 again
		}
	}
	d = st.Deployment(dynamo.Selector{})
	require.Empty(t, d.Workers)
	require.ErrorContains(t, d.Waiting[w.InstanceID], "no kv-events publisher for dp rank 3")
}

// TestStartRankPool: through PoolSink, the worker serving Dynamo's ranks 2
// and 3 is registered in the router with ranks 0 and 1, the subscriber is
// told its start rank before, and its publishers recover with queries
// naming Dynamo's ranks.
func TestStartRankPool(t *testing.T) {
	d := startRankState(t).Deployment(dynamo.Selector{})
	w := d.Workers[0]
	r, sub, sink := syncedPool(t, d)
	id := kvroute.WorkerID(w.InstanceID)
	require.Equal(t, []kvroute.WorkerKey{{ID: id, Rank: 0}, {ID: id, Rank: 1}}, r.Workers())
	require.Equal(t, 2, sub.DPStartRank(w.InstanceID))
	require.Eventually(t, func() bool {
		ranks := map[uint32]bool{}
		for _, p := range sub.Publishers() {
			if p.Recovery != nil {
				require.Equal(t, w.InstanceID, p.Recovery.WorkerID)
				ranks[p.Recovery.DPRank] = true
			}
		}
		return len(ranks) == 2 && ranks[2] && ranks[3]
	}, 5*time.Second, 5*time.Millisecond)

	sink.Sync(context.Background(), dynamo.Deployment{})
	require.Empty(t, r.Workers())
	require.Zero(t, sub.DPStartRank(w.InstanceID))
}

// plainPublishers follows publishers without counting ranks from a start
// rank.
type plainPublishers struct {
	mu   sync.Mutex
	pubs map[string]kvdynamo.Publisher
}

func (p *plainPublishers) AddPublisher(pub kvdynamo.Publisher) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pubs[pub.Endpoint] = pub
	return nil
}

func (p *plainPublishers) RemovePublisher(endpoint string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pubs, endpoint)
}

// A subscriber that cannot count ranks from a start rank would index the
// worker's events under the wrong ranks: PoolSink leaves the worker out.
func TestStartRankNeedsAbility(t *testing.T) {
	d := startRankState(t).Deployment(dynamo.Selector{})
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	require.NoError(t, err)
	sub := &plainPublishers{pubs: map[string]kvdynamo.Publisher{}}
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, DynamoEvents: dynamo.KVEvents(sub), RetryInterval: -1})
	require.NoError(t, err)
	defer pool.Close()
	dynamo.PoolSink(pool, sub).Sync(context.Background(), d)
	require.Empty(t, r.Workers())
	// The golden worker, whose ranks start at 0, is followed.
	dynamo.PoolSink(pool, sub).Sync(context.Background(), goldenState(t, "file").Deployment(dynamo.Selector{}))
	require.Len(t, r.Workers(), 1)
}

// natsChannels records the channels and start ranks a NATSSink gives it,
// and how many workers the router had when it got the start ranks.
type natsChannels struct {
	r      *router.Router
	mu     sync.Mutex
	subs   map[string]kvdynamo.NATSChannel
	starts map[uint64]int
	seen   int // router workers when the start ranks were first set, -1 before
}

func (n *natsChannels) AddChannel(ch kvdynamo.NATSChannel) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.subs[ch.Subject] = ch
	return nil
}

func (n *natsChannels) RemoveChannel(subject string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.subs, subject)
}

func (n *natsChannels) SetDPStartRanks(starts map[uint64]int) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.starts = starts
	if n.seen < 0 {
		n.seen = len(n.r.Workers())
	}
	return nil
}

func (n *natsChannels) DPStartRank(worker uint64) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.starts[worker]
}

// On the NATS event plane, Sinks gives the NATS subscriber the start
// ranks before PoolSink registers the worker, so that no message of the
// worker is counted from rank 0.
func TestStartRankNATSSink(t *testing.T) {
	st := startRankState(t)
	for _, f := range goldenFilesIn(t, "filestore-dp2") {
		if f.rec.Channel != nil {
			v := strings.Replace(string(f.value), `{"kind":"Zmq","config":{"endpoint":"`+f.rec.Channel.Endpoints[0]+`"}}`,
				`{"kind":"Nats","config":{"subject_prefix":"namespace.dynamo.component.backend.endpoint.generate"}}`, 1)
			require.NoError(t, st.Put(f.key, []byte(v), 0))
		}
	}
	d := st.Deployment(dynamo.Selector{})
	require.Len(t, d.Workers, 1)
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	require.NoError(t, err)
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, RetryInterval: -1})
	require.NoError(t, err)
	defer pool.Close()
	ns := &natsChannels{r: r, subs: map[string]kvdynamo.NATSChannel{}, seen: -1}
	dynamo.Sinks{dynamo.PoolSink(pool, nil), dynamo.NATSSink(ns)}.Sync(context.Background(), d)
	require.Len(t, r.Workers(), 2)
	require.Equal(t, map[uint64]int{d.Workers[0].InstanceID: 2}, ns.starts)
	require.Zero(t, ns.seen, "the start ranks came first")
	require.Contains(t, ns.subs, "namespace.dynamo.component.backend.endpoint.generate."+dynamo.TopicKVEvents)
}
