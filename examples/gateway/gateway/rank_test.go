package gateway_test

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/internal/zmqtest"
	"github.com/kvroute/kvroute/kvevents/kvprom"
	"github.com/kvroute/kvroute/router"
)

// A batch without a data-parallel rank (vLLM v0.9's two-element batch),
// published on rank 1's endpoint, is indexed under rank 1: the rank of the
// endpoint its subscriber listens to, not rank 0.
func TestGatewayRanklessBatchesLandOnTheirRank(t *testing.T) {
	pubs, events := zmqtest.RankPublishers(t, 2)
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	require.NoError(t, err)
	gw, err := gateway.New(gateway.Config{Router: r, HealthInterval: time.Hour, Engines: []gateway.Engine{
		{ID: 7, URL: "http://127.0.0.1:1", Events: events, Topic: "kv", Ranks: 2},
	}})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- gw.Run(ctx) }()
	defer func() {
		stop()
		require.NoError(t, <-ran)
	}()

	applied := func() bool { return r.Index().Stats().Applied > 0 }
	zmqtest.PublishUntil(t, pubs[1], "kv", zmqtest.RanklessBatch(t), applied)

	ix := r.Index()
	require.Len(t, ix.AppendWorkerBlocks(kvroute.WorkerKey{ID: 7, Rank: 1}, nil), 2, "blocks on rank 1")
	require.Empty(t, ix.AppendWorkerBlocks(kvroute.WorkerKey{ID: 7, Rank: 0}, nil), "blocks on rank 0")
}

// Config.Subscribers is given each rank's subscriber when an engine is
// added, named SubscriberName, and forgets them when it is removed: a
// kvprom.Collector exports the counters of exactly the added engines.
func TestGatewaySubscribersFollowEngines(t *testing.T) {
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	require.NoError(t, err)
	ingest := kvprom.New("kvroute")
	gw, err := gateway.New(gateway.Config{Router: r, HealthInterval: time.Hour, Subscribers: ingest, Engines: []gateway.Engine{
		{ID: 7, URL: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:5557", Ranks: 2},
		{ID: 8, URL: "http://127.0.0.1:1"}, // no events: no subscriber
	}})
	require.NoError(t, err)
	engines := func() []string {
		reg := prometheus.NewPedanticRegistry()
		require.NoError(t, reg.Register(ingest))
		mfs, err := reg.Gather()
		require.NoError(t, err)
		seen := map[string]bool{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "engine" {
						seen[l.GetValue()] = true
					}
				}
			}
		}
		return slices.Sorted(maps.Keys(seen))
	}
	require.Equal(t, []string{"7/0", "7/1"}, engines())
	require.NoError(t, gw.AddEngine(gateway.Engine{ID: 9, URL: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:6000"}))
	require.Equal(t, []string{"7/0", "7/1", "9/0"}, engines())
	require.True(t, gw.RemoveEngine(7))
	require.Equal(t, []string{"9/0"}, engines())
	require.Equal(t, "9/0", gateway.SubscriberName(9, 0))
}
