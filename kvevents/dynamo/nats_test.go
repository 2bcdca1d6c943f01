package dynamo_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents/dynamo"
)

// startNATS runs an in-process NATS server until the test ends and
// returns a connection to it and its URL.
func startNATS(t *testing.T) (*nats.Conn, string) {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	go srv.Start()
	require.True(t, srv.ReadyForConnections(10*time.Second))
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc, srv.ClientURL()
}

// runNATSSubscriber subscribes sub to the kv-events and kv_metrics
// subjects of dynamo/backend/generate (metrics with a capacity of 100
// blocks), runs it until the test ends (cancel stops it; the test fails
// if Run fails), and returns the two subjects and a function publishing
// an envelope on a subject.
func runNATSSubscriber(t *testing.T, ctx context.Context, cancel context.CancelFunc, nc *nats.Conn,
	sub *dynamo.NATSSubscriber) (events, metrics string, publish func(string, dynamo.Envelope)) {
	t.Helper()
	events = dynamo.Subject("dynamo", "backend", "generate", dynamo.TopicKVEvents)
	metrics = dynamo.Subject("dynamo", "backend", "generate", dynamo.TopicKVMetrics)
	require.NoError(t, sub.AddChannel(dynamo.NATSChannel{Subject: events}))
	require.NoError(t, sub.AddChannel(dynamo.NATSChannel{Subject: metrics, KVCapacityBlocks: 100}))
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	waitFor(t, ctx, "the subscriptions", func() bool { return sub.Stats().Reconnects == 2 }, nil)
	require.NoError(t, nc.Flush())
	return events, metrics, func(subject string, e dynamo.Envelope) {
		require.NoError(t, nc.Publish(subject, dynamo.AppendEnvelope(nil, &e)))
	}
}

func TestNATSSubscriber(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc, _ := startNATS(t)
	ix, err := indexer.New(indexer.Config{Hasher: testHasher})
	require.NoError(t, err)
	hb := &heartbeats{}
	_, err = dynamo.NewNATS(dynamo.NATSConfig{Sink: ix})
	require.ErrorIs(t, err, dynamo.ErrConfig)
	sub, err := dynamo.NewNATS(dynamo.NATSConfig{Conn: nc, Sink: ix, Load: hb})
	require.NoError(t, err)
	require.ErrorIs(t, sub.AddChannel(dynamo.NATSChannel{Subject: "namespace.>"}), dynamo.ErrConfig)
	events, metrics, publish := runNATSSubscriber(t, ctx, cancel, nc, sub)
	w := kvroute.WorkerKey{ID: 11}
	a, b := tokens(0, 8), tokens(100, 4)
	publish(events, dynamo.Envelope{Topic: dynamo.TopicKVEvents, PublisherID: 1, Sequence: 0, Payload: stored(t, w, 0, a)})
	// No topic in the envelope: the subject's last token names it.
	publish(events, dynamo.Envelope{PublisherID: 1, Sequence: 3, Payload: stored(t, w, 0, b)})
	require.NoError(t, nc.Publish(events, []byte("not an envelope")))
	al := dynamo.ActiveLoad{WorkerID: 11, KVUsedBlocks: dynamo.OptUint{Value: 50, Valid: true}}
	publish(metrics, dynamo.Envelope{Topic: dynamo.TopicKVMetrics, PublisherID: 2, Payload: dynamo.AppendActiveLoad(nil, &al)})
	waitFor(t, ctx, "the messages", func() bool { return sub.Stats().Received == 4 }, nil)

	st := sub.Stats()
	require.Equal(t, uint64(2), st.Applied)
	require.Equal(t, uint64(1), st.Gaps)
	require.Equal(t, uint64(2), st.Lost)
	require.Equal(t, uint64(1), st.Malformed)
	require.Equal(t, 2, matchBlocks(ix, a))
	require.Equal(t, 1, matchBlocks(ix, b))
	gw, l, n := hb.last()
	require.Equal(t, 1, n)
	require.Equal(t, w, gw)
	require.Equal(t, 0.5, l.KVUtilization)

	// A removed channel delivers nothing more once RemoveChannel returns:
	// a load report published after its event arrives alone.
	sub.RemoveChannel(events)
	publish(events, dynamo.Envelope{Topic: dynamo.TopicKVEvents, PublisherID: 1, Sequence: 4, Payload: stored(t, w, 0, tokens(200, 4))})
	publish(metrics, dynamo.Envelope{Topic: dynamo.TopicKVMetrics, PublisherID: 2, Sequence: 1, Payload: dynamo.AppendActiveLoad(nil, &al)})
	waitFor(t, ctx, "the load report", func() bool { _, _, n := hb.last(); return n == 2 }, nil)
	require.Equal(t, uint64(5), sub.Stats().Received)
	require.Zero(t, matchBlocks(ix, tokens(200, 4)))
}
