package dynamo_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/dynamo"
)

// holders returns the cache domains holding the first block of toks,
// sorted.
func holders(ix *indexer.Index, toks []uint32) []kvroute.WorkerKey {
	var r indexer.MatchResult
	ix.Match(testHasher.AppendSeqHashes(nil, toks), &r)
	var out []kvroute.WorkerKey
	for _, m := range r.Workers {
		out = append(out, m.Worker)
	}
	slices.SortFunc(out, func(a, b kvroute.WorkerKey) int {
		if a.ID != b.ID {
			return int(a.ID) - int(b.ID)
		}
		return int(a.Rank) - int(b.Rank)
	})
	return out
}

func TestSetDPStartRanks(t *testing.T) {
	ix, err := indexer.New(indexer.Config{Hasher: testHasher})
	require.NoError(t, err)
	sub, err := dynamo.New(dynamo.Config{Sink: ix})
	require.NoError(t, err)
	require.NoError(t, sub.SetDPStartRanks(map[uint64]int{7: 4, 8: 0}))
	require.Equal(t, 4, sub.DPStartRank(7))
	require.Zero(t, sub.DPStartRank(8))
	require.Zero(t, sub.DPStartRank(9))
	require.ErrorIs(t, sub.SetDPStartRanks(map[uint64]int{7: -1}), dynamo.ErrConfig)
	require.ErrorIs(t, sub.SetDPStartRanks(map[uint64]int{7: 1 << 40}), dynamo.ErrConfig)
	require.Equal(t, 4, sub.DPStartRank(7), "a refused table changes nothing")
	require.NoError(t, sub.SetDPStartRanks(nil))
	require.Zero(t, sub.DPStartRank(7))
}

// TestNATSSharedSubject: the workers of an endpoint publish on one NATS
// subject. The subscriber subscribes to it once and attributes each
// message to the worker and rank its payload names, whoever else
// publishes on the subject: the sequences of its publishers are checked
// apart (interleaved, neither shows a gap), and the ranks of a worker
// whose ranks start at 4 (multi-node data parallelism) are counted from
// its start rank.
func TestNATSSharedSubject(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc, _ := startNATS(t)
	ix, err := indexer.New(indexer.Config{Hasher: testHasher})
	require.NoError(t, err)
	hb := &heartbeats{}
	sub, err := dynamo.NewNATS(dynamo.NATSConfig{Conn: nc, Sink: ix, Load: hb})
	require.NoError(t, err)
	const (
		first, second = 11, 22 // instance ids; second serves ranks 4 and 5
		pubA, pubB    = 101, 202
	)
	require.NoError(t, sub.SetDPStartRanks(map[uint64]int{second: 4}))
	events, metrics, publish := runNATSSubscriber(t, ctx, cancel, nc, sub)
	kv := func(pub, seq uint64, w kvroute.WorkerKey, toks []uint32) {
		publish(events, dynamo.Envelope{Topic: dynamo.TopicKVEvents, PublisherID: pub, Sequence: seq, Payload: stored(t, w, 0, toks)})
	}
	a0, a1, b4, b5, below := tokens(0, 8), tokens(100, 4), tokens(200, 4), tokens(300, 8), tokens(400, 4)
	// Dynamo's absolute ranks on the wire, interleaved publishers.
	kv(pubA, 0, kvroute.WorkerKey{ID: first, Rank: 0}, a0)
	kv(pubB, 0, kvroute.WorkerKey{ID: second, Rank: 4}, b4)
	kv(pubA, 1, kvroute.WorkerKey{ID: first, Rank: 1}, a1)
	kv(pubB, 1, kvroute.WorkerKey{ID: second, Rank: 5}, b5)
	kv(pubB, 2, kvroute.WorkerKey{ID: second, Rank: 3}, below) // not one of its ranks
	al := dynamo.ActiveLoad{WorkerID: second, DPRank: 5, KVUsedBlocks: dynamo.OptUint{Value: 25, Valid: true}}
	publish(metrics, dynamo.Envelope{Topic: dynamo.TopicKVMetrics, PublisherID: pubB + 1, Payload: dynamo.AppendActiveLoad(nil, &al)})
	waitFor(t, ctx, "the messages", func() bool { return sub.Stats().Received == 6 }, nil)

	require.Equal(t, []kvroute.WorkerKey{{ID: first, Rank: 0}}, holders(ix, a0))
	require.Equal(t, []kvroute.WorkerKey{{ID: first, Rank: 1}}, holders(ix, a1))
	require.Equal(t, []kvroute.WorkerKey{{ID: second, Rank: 0}}, holders(ix, b4))
	require.Equal(t, []kvroute.WorkerKey{{ID: second, Rank: 1}}, holders(ix, b5))
	require.Empty(t, holders(ix, below))
	st := sub.Stats()
	require.Equal(t, uint64(2), st.Reconnects, "one subscription per subject")
	require.Zero(t, st.Gaps)
	require.Zero(t, st.Duplicates)
	require.Equal(t, uint64(4), st.Applied)
	require.Equal(t, uint64(1), st.Malformed, "the event of rank 3")
	gw, l, n := hb.last()
	require.Equal(t, 1, n)
	require.Equal(t, kvroute.WorkerKey{ID: second, Rank: 1}, gw)
	require.Equal(t, 0.25, l.KVUtilization)
}

// TestRecoveryOffsetRanks: a worker serving ranks 2 and 3 is restored
// from its query endpoint: the query names Dynamo's rank (3), the dump's
// and the live events' rank 3 are the router's rank 1.
func TestRecoveryOffsetRanks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	abs := kvroute.WorkerKey{ID: 41, Rank: 3}
	dumped, live := tokens(7000, 4), tokens(7100, 4)
	srv := dynamo.NewQueryServer(t, func(int, *uint64) dynamo.QueryAnswer {
		return dynamo.QueryAnswer{Kind: "TreeDump", Events: []kvevents.DynamoEvent{storedEvent(abs, 5, dumped)}, LastEventID: 5}
	})
	pub := newPublisher(t, ctx)
	ix, err := indexer.New(indexer.Config{Hasher: testHasher})
	require.NoError(t, err)
	sub, err := dynamo.New(dynamo.Config{Sink: ix})
	require.NoError(t, err)
	require.NoError(t, sub.SetDPStartRanks(map[uint64]int{uint64(abs.ID): 2}))
	tgt := srv.Target(uint64(abs.ID), uint32(abs.Rank))
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: pub.ep, Recovery: &tgt}))
	startSubscriber(t, ctx, sub, pub)
	waitFor(t, ctx, "the dump", func() bool { return sub.Stats().Restored == 1 }, nil)
	pub.sendEvents(t, 1, 0, storedEvent(abs, 6, live))
	waitFor(t, ctx, "the live event", func() bool { return matchBlocks(ix, live) == 1 }, nil)
	rel := kvroute.WorkerKey{ID: abs.ID, Rank: 1}
	require.Equal(t, []kvroute.WorkerKey{rel}, holders(ix, dumped))
	require.Equal(t, []kvroute.WorkerKey{rel}, holders(ix, live))
	st := sub.Stats()
	require.Zero(t, st.QueryErrs)
	require.Zero(t, st.EventGaps)
	require.Zero(t, st.Malformed)
}

// TestRecoveryResetScope: a dump whose reset_scope is not "all" does not
// replace what is known of the worker: it is refused (QueryErrs), not
// applied, and the worker's recovery is given up at once (asking again
// would get the same answer); its live events are applied as without
// recovery.
func TestRecoveryResetScope(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := kvroute.WorkerKey{ID: 51}
	dumped, live := tokens(8000, 4), tokens(8100, 4)
	srv := dynamo.NewQueryServer(t, func(int, *uint64) dynamo.QueryAnswer {
		return dynamo.QueryAnswer{Kind: "TreeDump", Events: []kvevents.DynamoEvent{storedEvent(w, 1, dumped)}, LastEventID: 1,
			ResetScope: "domain"}
	})
	pub, ix, sub := follow(t, ctx, dynamo.Config{}, new(srv.Target(uint64(w.ID), 0)))
	waitFor(t, ctx, "the refused dump", func() bool { return sub.Stats().Abandoned == 1 }, nil)
	pub.sendEvents(t, 1, 0, storedEvent(w, 9, live))
	waitFor(t, ctx, "the live event", func() bool { return matchBlocks(ix, live) == 1 }, nil)
	require.Zero(t, matchBlocks(ix, dumped))
	st := sub.Stats()
	require.Equal(t, uint64(1), st.Queries, "not asked again")
	require.Equal(t, uint64(1), st.QueryErrs)
	require.Zero(t, st.Restored)
}
