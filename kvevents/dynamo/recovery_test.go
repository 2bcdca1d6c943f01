package dynamo_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/dynamo"
)

// storedEvent is a RouterEvent storing tokens (whole blocks, root) for
// worker w with event id id.
func storedEvent(w kvroute.WorkerKey, id uint64, toks []uint32) kvevents.DynamoEvent {
	d := kvevents.DynamoEvent{WorkerID: uint64(w.ID), DPRank: uint32(w.Rank), EventID: id, Kind: kvevents.DynamoStored}
	for _, h := range testHasher.AppendBlockHashes(nil, toks) {
		d.Blocks = append(d.Blocks, kvevents.DynamoBlock{BlockHash: uint64(h), TokensHash: uint64(h)})
	}
	return d
}

// follow runs a subscriber with cfg into a new index until the test
// ends, following a new publisher (whose worker it recovers from tgt when
// not nil), and waits until it hears the publisher.
func follow(t *testing.T, ctx context.Context, cfg dynamo.Config, tgt *dynamo.RecoveryTarget) (*publisher, *indexer.Index, *dynamo.Subscriber) {
	t.Helper()
	pub := newPublisher(t, ctx)
	ix, err := indexer.New(indexer.Config{Hasher: testHasher})
	require.NoError(t, err)
	cfg.Sink = ix
	sub, err := dynamo.New(cfg)
	require.NoError(t, err)
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: pub.ep, Recovery: tgt}))
	startSubscriber(t, ctx, sub, pub)
	return pub, ix, sub
}

// sendEvents publishes RouterEvents in one kv-events message.
func (p *publisher) sendEvents(t *testing.T, pubID, seq uint64, evs ...kvevents.DynamoEvent) {
	payload, err := dynamo.AppendRouterEvents(nil, evs)
	require.NoError(t, err)
	p.message(pubID, seq, dynamo.TopicKVEvents, payload)
}

// TestRecoveryDoesNotStall: a worker whose query endpoint accepts the
// query and never answers holds only its own events: another worker's
// events on the same publisher are applied while the query is under way.
// When the query times out, the held events are applied in order, none
// lost; the recovery is retried in the background and restores the worker
// from a dump once the endpoint answers again.
func TestRecoveryDoesNotStall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := kvroute.WorkerKey{ID: 21}, kvroute.WorkerKey{ID: 22}
	dumped := tokens(5000, 4)
	srv := dynamo.NewQueryServer(t, func(n int, start *uint64) dynamo.QueryAnswer {
		if n == 1 {
			return dynamo.QueryAnswer{Hang: true}
		}
		return dynamo.QueryAnswer{Kind: "TreeDump", Events: []kvevents.DynamoEvent{storedEvent(a, 2, dumped)}, LastEventID: 2}
	})
	const timeout = 3 * time.Second
	pub, ix, sub := follow(t, ctx, dynamo.Config{Query: dynamo.Querier{Timeout: timeout}}, new(srv.Target(uint64(a.ID), 0)))
	// The dump asked for when the publisher was added hangs.
	select {
	case n := <-srv.Started():
		require.Equal(t, 1, n)
	case <-ctx.Done():
		t.Fatal("no query")
	}
	began := time.Now()

	a1, a2, b1 := tokens(100, 4), tokens(200, 4), tokens(300, 4)
	pub.sendEvents(t, 1, 0, storedEvent(a, 3, a1))
	pub.sendEvents(t, 1, 1, storedEvent(b, 1, b1), storedEvent(a, 4, a2))
	waitFor(t, ctx, "the other worker's event", func() bool { return matchBlocks(ix, b1) == 1 }, nil)
	heldA1, heldA2 := matchBlocks(ix, a1), matchBlocks(ix, a2)
	st := sub.Stats()
	require.Zero(t, st.QueryErrs, "the query ended within %v: the machine is too slow for this test", time.Since(began))
	require.Zero(t, heldA1, "the worker's events wait for its query")
	require.Zero(t, heldA2)

	// The query times out: the held events are applied, in order.
	waitFor(t, ctx, "the held events", func() bool { return matchBlocks(ix, a1) == 1 && matchBlocks(ix, a2) == 1 }, nil)
	st = sub.Stats()
	require.Equal(t, uint64(1), st.QueryErrs)
	require.Zero(t, st.LostEvents)

	// The retry finds the endpoint answering: the dump is applied and the
	// live events after it again.
	waitFor(t, ctx, "the retried dump", func() bool { return sub.Stats().Restored == 1 }, nil)
	require.Equal(t, 1, matchBlocks(ix, dumped))
	require.Equal(t, 1, matchBlocks(ix, a1))
	require.Equal(t, 1, matchBlocks(ix, a2))
	require.Equal(t, 1, matchBlocks(ix, b1))
	st = sub.Stats()
	t.Logf("subscriber: %+v", st)
	require.Zero(t, st.Abandoned)
	require.Zero(t, st.ApplyErrs)
}

// TestRecoveryGivesUp: a query endpoint that never answers is given up on
// after RecoveryGiveUp, counted; the worker's events are then applied as
// without recovery, with no further query.
func TestRecoveryGivesUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := kvroute.WorkerKey{ID: 31, Rank: 1}
	srv := dynamo.NewQueryServer(t, func(int, *uint64) dynamo.QueryAnswer { return dynamo.QueryAnswer{Hang: true} })
	pub, ix, sub := follow(t, ctx, dynamo.Config{Query: dynamo.Querier{Timeout: 200 * time.Millisecond}, RecoveryGiveUp: time.Second}, new(srv.Target(uint64(w.ID), uint32(w.Rank))))
	began := time.Now()
	waitFor(t, ctx, "the worker to be given up on", func() bool { return sub.Stats().Abandoned == 1 }, nil)
	t.Logf("given up after %v", time.Since(began))
	st := sub.Stats()
	require.GreaterOrEqual(t, st.Queries, uint64(2), "retried")
	require.Equal(t, st.Queries, st.QueryErrs)

	a1, a2 := tokens(100, 4), tokens(200, 4)
	pub.sendEvents(t, 1, 0, storedEvent(w, 7, a1))
	pub.sendEvents(t, 1, 1, storedEvent(w, 10, a2)) // a gap of 2, not asked for
	waitFor(t, ctx, "the events", func() bool { return matchBlocks(ix, a1) == 1 && matchBlocks(ix, a2) == 1 }, nil)
	st2 := sub.Stats()
	require.Equal(t, st.Queries, st2.Queries)
	require.Equal(t, uint64(1), st2.EventGaps)
	require.Equal(t, uint64(2), st2.LostEvents)
}

// TestRecoveryAtAdd: a worker that publishes nothing is restored from a
// dump when its publisher is added; a later gap is filled by an events
// query, in order, before the live event.
func TestRecoveryAtAdd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := kvroute.WorkerKey{ID: 41}
	root, child, live := tokens(100, 4), tokens(200, 4), tokens(300, 4)
	rootEv := storedEvent(w, 5, root)
	childEv := storedEvent(w, 6, child)
	childEv.HasParent, childEv.ParentHash = true, rootEv.Blocks[0].BlockHash
	var (
		mu    sync.Mutex
		asked []*uint64
	)
	srv := dynamo.NewQueryServer(t, func(n int, start *uint64) dynamo.QueryAnswer {
		mu.Lock()
		asked = append(asked, start)
		mu.Unlock()
		if start == nil {
			return dynamo.QueryAnswer{Kind: "TreeDump", Events: []kvevents.DynamoEvent{rootEv}, LastEventID: 5}
		}
		return dynamo.QueryAnswer{Kind: "Events", Events: []kvevents.DynamoEvent{childEv, storedEvent(w, 7, tokens(900, 4))}, LastEventID: 7}
	})
	pub, ix, sub := follow(t, ctx, dynamo.Config{}, new(srv.Target(uint64(w.ID), 0)))
	waitFor(t, ctx, "the dump", func() bool { return sub.Stats().Restored == 1 }, nil)
	require.Equal(t, 1, matchBlocks(ix, root))

	// Event 8 after 5: events 6 and 7 are asked for; 8's parent is 6's block.
	liveEv := storedEvent(w, 8, live)
	liveEv.HasParent, liveEv.ParentHash = true, childEv.Blocks[0].BlockHash
	pub.sendEvents(t, 1, 0, liveEv)
	waitFor(t, ctx, "the live event", func() bool {
		return matchBlocks(ix, append(append(append([]uint32{}, root...), child...), live...)) == 3
	}, nil)
	st := sub.Stats()
	t.Logf("subscriber: %+v", st)
	require.Equal(t, uint64(1), st.EventGaps)
	require.Equal(t, uint64(3), st.Recovered)
	require.Zero(t, st.LostEvents)
	require.Zero(t, st.ApplyErrs)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, asked, 2)
	require.Nil(t, asked[0])
	require.Equal(t, uint64(6), *asked[1])
}

// TestRemoveDuringQuery: removing a publisher while its worker's query is
// under way drops the worker's held events; the answer, if any, is never
// applied.
func TestRemoveDuringQuery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := kvroute.WorkerKey{ID: 51}
	srv := dynamo.NewQueryServer(t, func(int, *uint64) dynamo.QueryAnswer { return dynamo.QueryAnswer{Hang: true} })
	pub, other := newPublisher(t, ctx), newPublisher(t, ctx)
	ix, err := indexer.New(indexer.Config{Hasher: testHasher})
	require.NoError(t, err)
	sub, err := dynamo.New(dynamo.Config{Sink: ix, Query: dynamo.Querier{Timeout: 20 * time.Second}})
	require.NoError(t, err)
	tgt := srv.Target(uint64(w.ID), 0)
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: pub.ep, Recovery: &tgt}))
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: other.ep}))
	startSubscriber(t, ctx, sub, pub)
	<-srv.Started()
	held := tokens(100, 4)
	pub.sendEvents(t, 1, 0, storedEvent(w, 3, held))
	// A sentinel on the same publisher: once applied, the held event was
	// handled (and held).
	sentinel := tokens(700, 4)
	waitFor(t, ctx, "the sentinel", func() bool { return matchBlocks(ix, sentinel) == 1 },
		func() { pub.sendEvents(t, 1, 1, storedEvent(kvroute.WorkerKey{ID: 52}, 1, sentinel)) })
	require.Zero(t, matchBlocks(ix, held))
	sub.RemovePublisher(pub.ep)
	// Nothing of the removed worker is applied later: a sentinel on the
	// other publisher goes through the loop after the removal.
	after := tokens(800, 4)
	waitFor(t, ctx, "the other sentinel", func() bool { return matchBlocks(ix, after) == 1 },
		func() { other.sendEvents(t, 2, 0, storedEvent(kvroute.WorkerKey{ID: 53}, 1, after)) })
	require.Zero(t, matchBlocks(ix, held))
	require.Zero(t, sub.Stats().QueryErrs)
}
