package dynamo_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/dynamo"
)

// A worker with a recovery target whose engine restarts numbers its
// events from 1 again: the subscriber forgets the old event ids, asks the
// worker for its cache anew and applies its new events, instead of
// skipping them as already applied.
func TestRestartWithRecovery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w := kvroute.WorkerKey{ID: 31}
	before, after, later := tokens(100, 4), tokens(200, 4), tokens(300, 4)
	srv := dynamo.NewQueryServer(t, func(n int, _ *uint64) dynamo.QueryAnswer {
		if n == 1 {
			return dynamo.QueryAnswer{Kind: "TreeDump", Events: []kvevents.DynamoEvent{storedEvent(w, 10, before)}, LastEventID: 10}
		}
		return dynamo.QueryAnswer{Kind: "TreeDump", Events: []kvevents.DynamoEvent{storedEvent(w, 1, after)}, LastEventID: 1}
	})
	pub, ix, sub := follow(t, ctx, dynamo.Config{}, new(srv.Target(uint64(w.ID), 0)))
	waitFor(t, ctx, "the first dump", func() bool { return sub.Stats().Restored == 1 }, nil)
	pub.sendEvents(t, 1, 0, storedEvent(w, 11, tokens(150, 4)))
	waitFor(t, ctx, "event 11", func() bool { return matchBlocks(ix, tokens(150, 4)) == 1 }, nil)

	// The engine restarts: its publisher counts from 0, its events from 1.
	pub.sendEvents(t, 1, 0, storedEvent(w, 1, after))
	pub.sendEvents(t, 1, 1, storedEvent(w, 2, later))
	waitFor(t, ctx, "the restarted worker's events", func() bool {
		return matchBlocks(ix, after) == 1 && matchBlocks(ix, later) == 1
	}, nil)
	st := sub.Stats()
	require.Equal(t, uint64(1), st.Restarts)
	require.Zero(t, matchBlocks(ix, before), "the old cache is forgotten")
	require.Zero(t, matchBlocks(ix, tokens(150, 4)))
	require.Equal(t, uint64(2), st.Restored, "the restarted worker's cache was asked for anew; stats %+v", st)
}

// A restarted publisher's first messages are often lost before the
// subscriber reconnects: a sequence that went back on a new connection is
// a restart (the worker is reset and the new events applied), not a run
// of duplicates.
func TestRestartSeenOnReconnect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pub, ix, sub := follow(t, ctx, dynamo.Config{MaxBackoff: 100 * time.Millisecond}, nil)
	w := kvroute.WorkerKey{ID: 4}
	for seq := range uint64(6) {
		pub.message(1, seq, dynamo.TopicKVEvents, stored(t, w, 0, tokens(int(seq)*10, 4)))
	}
	waitFor(t, ctx, "the first run", func() bool { return matchBlocks(ix, tokens(50, 4)) == 1 }, nil)

	again := pub.restart(ctx)
	send := func(seq uint64, toks []uint32) { again.message(1, seq, dynamo.TopicKVEvents, stored(t, w, 0, toks)) }
	send(0, tokens(1000, 4)) // before the subscriber is back: lost
	send(1, tokens(1010, 4))
	seq := uint64(2)
	waitFor(t, ctx, "a store of the restarted publisher", func() bool { return matchBlocks(ix, tokens(1000+10*int(seq-1), 4)) == 1 },
		func() { send(seq, tokens(1000+10*int(seq), 4)); seq++ })
	st := sub.Stats()
	require.Equal(t, uint64(1), st.Restarts, "stats %+v", st)
	require.Zero(t, matchBlocks(ix, tokens(0, 4)), "the first run's blocks are forgotten")
	require.Zero(t, st.Duplicates)
}
