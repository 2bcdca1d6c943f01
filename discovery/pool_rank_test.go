package discovery_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/internal/zmqtest"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/zmq"
	"github.com/kvroute/kvroute/router"
)

// rankless is a vLLM v0.9-style batch (no rank slot) storing two 16-token
// blocks.
func rankless(t *testing.T) []byte {
	t.Helper()
	tokens := make([]uint32, 32)
	for i := range tokens {
		tokens[i] = uint32(100 + i)
	}
	payload, err := kvevents.AppendBatch(nil, &kvevents.Batch{Timestamp: 1, Events: []kvevents.EngineEvent{{
		Type: kvevents.BlockStored, Fields: kvevents.StoredFieldsV09,
		BlockHashes: []kvevents.Hash{kvevents.UintHash(11), kvevents.UintHash(12)},
		TokenIDs:    tokens, BlockSize: 16,
	}}})
	require.NoError(t, err)
	return payload
}

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

	payload := rankless(t)
	// A PUB socket drops what is sent before the subscriber has joined:
	// publish until the batch is applied.
	var seq uint64
	require.Eventually(t, func() bool {
		_ = pubs[1].Send(zmq4.NewMsgFrom([]byte("kv"), binary.BigEndian.AppendUint64(nil, seq), payload))
		seq++
		return r.Index().Stats().Applied > 0
	}, 10*time.Second, 20*time.Millisecond)

	ix := r.Index()
	require.Len(t, ix.AppendWorkerBlocks(kvroute.WorkerKey{ID: 7, Rank: 1}, nil), 2, "blocks on rank 1")
	require.Empty(t, ix.AppendWorkerBlocks(kvroute.WorkerKey{ID: 7, Rank: 0}, nil), "blocks on rank 0")
}
