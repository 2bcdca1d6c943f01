package discovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/internal/zmqtest"
	"github.com/kvroute/kvroute/kvevents/zmq"
	"github.com/kvroute/kvroute/router"
)

// TestPoolRanklessBatchesLandOnTheirRank checks that a batch without a
// data-parallel rank, published on rank 1's endpoint, is indexed under
// rank 1 (the rank of the subscriber's endpoint), not rank 0.
func TestPoolRanklessBatchesLandOnTheirRank(t *testing.T) {
	ctx := context.Background()
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	require.NoError(t, err)
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, Subscriber: zmq.Config{IdleTimeout: time.Second}})
	require.NoError(t, err)
	defer pool.Close()

	pubs, events := zmqtest.RankPublishers(t, 2)
	e := discovery.Engine{Name: "ns/dp", ID: 7, Host: "127.0.0.1", Ports: []int{8000, 8001}, Ready: true,
		Events: events, Topic: "kv", Kind: "vllm"}
	pool.Sync(ctx, []discovery.Engine{e})
	require.Empty(t, pool.Rejected())

	applied := func() bool { return r.Index().Stats().Applied > 0 }
	zmqtest.PublishUntil(t, pubs[1], "kv", zmqtest.RanklessBatch(t), applied)

	ix := r.Index()
	require.Len(t, ix.AppendWorkerBlocks(kvroute.WorkerKey{ID: 7, Rank: 1}, nil), 2, "blocks on rank 1")
	require.Empty(t, ix.AppendWorkerBlocks(kvroute.WorkerKey{ID: 7, Rank: 0}, nil), "blocks on rank 0")
}
