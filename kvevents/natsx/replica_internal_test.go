package natsx

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/scheduling"
)

// eventMsg encodes a Stored event of one block (external hash ext, under
// parent when not 0) of worker w as the Publisher sends it.
func eventMsg(t *testing.T, w kvroute.WorkerKey, id uint64, ext, parent kvroute.ExternalHash) []byte {
	t.Helper()
	ev := kvroute.Event{Kind: kvroute.EventStored, Worker: w, ID: id,
		Blocks: []kvroute.StoredBlock{{External: ext, Hash: kvroute.BlockHash(ext) * 3}}, HasParent: parent != 0, Parent: parent}
	var d kvevents.DynamoEvent
	require.NoError(t, d.FromEvent(&ev, kvroute.Hasher{}))
	msg, err := kvevents.AppendDynamoEvent(nil, &d)
	require.NoError(t, err)
	return msg
}

// A repair abandoned when the replica learns that the relay restarted
// (the new Publisher's heads) may still deliver its result: a peer's dump
// of the old sequence. It must not complete the repair of the new
// sequence, whose events would then be dropped as duplicates.
func TestStaleRepairResultIsIgnored(t *testing.T) {
	h := newReplicaHarness(t)
	l, end, ix, _ := h.newLoop(t)
	defer end()
	// The repair goroutines give up at once: the test hands the results
	// to finishRepair itself, in the order it needs.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l.ctx = ctx
	w := kvroute.WorkerKey{ID: 3}
	held := func() []kvroute.SeqHash {
		b := ix.AppendWorkerBlocks(w, nil)
		slices.Sort(b)
		return b
	}

	l.handleHeads(appendHeads(nil, &heads{epoch: 1, last: []workerID{{worker: w, id: 0}}}))
	l.handleEvent(&nats.Msg{Data: eventMsg(t, w, 1, 11, 0)})
	l.handleEvent(&nats.Msg{Data: eventMsg(t, w, 2, 12, 11)})
	l.handleEvent(&nats.Msg{Data: eventMsg(t, w, 3, 13, 12)})
	require.Len(t, held(), 3)
	l.handleEvent(&nats.Msg{Data: eventMsg(t, w, 5, 15, 14)}) // event 4 lost: a repair up to 4
	old := l.repairs[w]
	require.NotNil(t, old)
	// The relay restarts and the replica missed its marker: the new
	// Publisher's heads start the worker over and repair it up to 2.
	l.handleHeads(appendHeads(nil, &heads{epoch: 2, last: []workerID{{worker: w, id: 2}}}))
	require.Empty(t, held())
	cur := l.repairs[w]
	require.NotNil(t, cur)
	require.NotEqual(t, old.gen, cur.gen)

	// The old repair's peer dump arrives first: the old sequence through 4.
	var dump []kvevents.DynamoEvent
	for i, ext := range []kvroute.ExternalHash{11, 12, 13, 14} {
		var d kvevents.DynamoEvent
		ev := kvroute.Event{Kind: kvroute.EventStored, Worker: w,
			Blocks: []kvroute.StoredBlock{{External: ext, Hash: kvroute.BlockHash(ext) * 3}}, HasParent: i > 0, Parent: ext - 1}
		require.NoError(t, d.FromEvent(&ev, kvroute.Hasher{}))
		dump = append(dump, d)
	}
	l.finishRepair(repairResult{worker: w, gen: old.gen, kind: byDump, last: 4, chunks: []*dumpChunk{{events: dump}}})
	require.Empty(t, held(), "the old sequence's dump was applied")
	require.Zero(t, l.last[w])
	require.Same(t, cur, l.repairs[w], "the stale result ended the current repair")

	// The current repair's replay of the new sequence completes it.
	l.finishRepair(repairResult{worker: w, gen: cur.gen, kind: byReplay,
		msgs: [][]byte{eventMsg(t, w, 1, 101, 0), eventMsg(t, w, 2, 102, 101)}})
	require.Nil(t, l.repairs[w])
	require.Equal(t, uint64(2), l.last[w])
	l.handleEvent(&nats.Msg{Data: eventMsg(t, w, 3, 103, 102)})
	require.Equal(t, uint64(3), l.last[w])
	require.Len(t, held(), 3)
	st := h.r.Stats()
	require.Zero(t, st.ByDump)
	require.Equal(t, uint64(1), st.ByReplay)
}

// MaxPeerRequests bounds the requests kept of each peer and of this
// replica's own: past it a request is counted in Overflow and neither
// tracked nor shared, and room freed by a request that ends is used again.
func TestMaxPeerRequestsOverflow(t *testing.T) {
	w := kvroute.WorkerKey{ID: 2}
	add := func(id scheduling.RequestID) loadOp {
		return loadOp{op: opAdd, id: id, worker: w, prefillTokens: 16, blocks: []kvroute.SeqHash{kvroute.SeqHash(id)}}
	}
	tests := []struct {
		name string
		// add adds request id (of a peer, or of this replica's router)
		// and free ends it; kept returns the requests the replica keeps.
		add, free func(l *loop, id scheduling.RequestID)
		kept      func(l *loop) int
	}{
		{"a peer's requests",
			func(l *loop, id scheduling.RequestID) {
				ps := l.peers["peer"]
				seq := uint64(1)
				if ps != nil {
					seq = ps.seq + 1
				}
				l.handleLoad(appendLoadBatch(nil, &loadBatch{origin: "peer", incarnation: 1, seq: seq, ops: []loadOp{add(id)}}))
			},
			func(l *loop, id scheduling.RequestID) {
				l.handleLoad(appendLoadBatch(nil, &loadBatch{origin: "peer", incarnation: 1, seq: l.peers["peer"].seq + 1,
					ops: []loadOp{{op: opFree, id: id}}}))
			},
			func(l *loop) int { return l.r.cfg.Tracker.Len() }},
		{"this replica's own",
			func(l *loop, id scheduling.RequestID) { l.r.Added(id, w, []kvroute.SeqHash{kvroute.SeqHash(id)}, 16) },
			func(l *loop, id scheduling.RequestID) { l.r.Freed(id) },
			func(l *loop) int { l.r.mu.Lock(); defer l.r.mu.Unlock(); return len(l.r.own) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newReplicaHarness(t)
			l, end, _, _ := h.newLoop(t)
			defer end()
			bound := h.r.cfg.MaxPeerRequests
			for id := range scheduling.RequestID(bound + 2) {
				tt.add(l, id+1)
			}
			require.Equal(t, bound, tt.kept(l))
			require.Equal(t, uint64(2), h.r.Stats().Overflow)
			tt.free(l, 1)
			require.Equal(t, bound-1, tt.kept(l))
			tt.add(l, 100)
			require.Equal(t, bound, tt.kept(l))
			require.Equal(t, uint64(2), h.r.Stats().Overflow, "a request refused with room free")
			tt.add(l, 101)
			require.Equal(t, uint64(3), h.r.Stats().Overflow)
		})
	}
}

// An event in order by the replica's sequence is applied even when the
// index's own sequence position says otherwise (the host applied events
// to it too): the worker's other blocks stay.
func TestEventInOrderDespiteTheIndexSequence(t *testing.T) {
	w := kvroute.WorkerKey{ID: 4}
	tests := []struct {
		name   string
		hostID uint64 // the ID of the event the host applied itself
		last   uint64 // the replica's last event ID of w
	}{
		{"index ahead: a duplicate to the index", 5, 1},
		{"index behind: a gap to the index", 1, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newReplicaHarness(t)
			l, end, ix, _ := h.newLoop(t)
			defer end()
			require.NoError(t, ix.Apply(&kvroute.Event{Kind: kvroute.EventStored, Worker: w, ID: tt.hostID,
				Blocks: []kvroute.StoredBlock{{External: 50, Hash: 150}}}))
			l.last[w] = tt.last
			l.handleEvent(&nats.Msg{Data: eventMsg(t, w, tt.last+1, 11, 0)})
			require.Len(t, ix.AppendWorkerBlocks(w, nil), 2)
			require.Equal(t, tt.last+1, l.last[w])
			require.Equal(t, uint64(1), h.r.Stats().Applied)
		})
	}
}

// A replica is in sync with an asker's worker only on the same relay's
// sequence: one still on an old relay's sequence is not, whatever its
// last event ID, nor one that does not know its sequence's relay; an
// asker that does not know its relay takes any.
func TestInSyncComparesRelayEpochs(t *testing.T) {
	w := kvroute.WorkerKey{ID: 5}
	tests := []struct {
		name         string
		mine, theirs uint64 // the relays' epochs here and of the asker (0: not known)
		id           uint64 // the event ID asked for
		want         bool
	}{
		{"same relay, reached", 1, 1, 4, true},
		{"same relay, behind", 1, 1, 6, false},
		{"another relay", 1, 2, 2, false},
		{"the asker does not know", 1, 0, 4, true},
		{"this replica does not know", 0, 2, 4, false},
		{"neither knows", 0, 0, 4, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newReplicaHarness(t)
			l, end, _, _ := h.newLoop(t)
			defer end()
			l.last[w] = 5
			if tt.mine != 0 {
				l.epochs[w] = tt.mine
			}
			require.Equal(t, tt.want, l.inSync(w, tt.id, tt.theirs))
		})
	}
}

// markerMsg is a relay's new-sequence marker of w, naming relay epoch when
// not 0 (a relay of an older version names none).
func markerMsg(t *testing.T, w kvroute.WorkerKey, epoch uint64) *nats.Msg {
	t.Helper()
	var d kvevents.DynamoEvent
	require.NoError(t, d.FromEvent(&kvroute.Event{Kind: kvroute.EventCleared, Worker: w}, kvroute.Hasher{}))
	msg, err := kvevents.AppendDynamoEvent(nil, &d)
	require.NoError(t, err)
	m := &nats.Msg{Data: msg}
	if epoch != 0 {
		m.Header = nats.Header{EpochHeader: []string{strconv.FormatUint(epoch, 10)}}
	}
	return m
}

// A replica follows a worker's sequence as the announcing relay's only
// when it knows the sequence is that relay's. Heads of a relay it cannot
// tie its sequence to (an old relay's, or one it does not know) start
// the worker over from that relay's first event, whatever the last IDs
// say; only a worker of which nothing was applied takes the relay as it
// is.
func TestHeadsOfAnUnknownRelayStartTheWorkerOver(t *testing.T) {
	w := kvroute.WorkerKey{ID: 6}
	const relay = 7
	tests := []struct {
		name    string
		before  func(t *testing.T, l *loop) // the messages the replica got before the heads
		head    uint64                      // the relay's last ID of w
		resync  bool                        // the worker must start over
		repairs bool                        // a repair up to head must be under way
	}{
		{"marker naming the relay, in sync", func(t *testing.T, l *loop) {
			l.handleEvent(markerMsg(t, w, relay))
			l.handleEvent(&nats.Msg{Data: eventMsg(t, w, 1, 11, 0)})
			l.handleEvent(&nats.Msg{Data: eventMsg(t, w, 2, 12, 11)})
		}, 2, false, false},
		{"marker naming the relay, behind", func(t *testing.T, l *loop) {
			l.handleEvent(markerMsg(t, w, relay))
			l.handleEvent(&nats.Msg{Data: eventMsg(t, w, 1, 11, 0)})
		}, 3, false, true},
		{"marker naming another relay", func(t *testing.T, l *loop) {
			l.handleEvent(markerMsg(t, w, relay+1))
			l.handleEvent(&nats.Msg{Data: eventMsg(t, w, 1, 11, 0)})
			l.handleEvent(&nats.Msg{Data: eventMsg(t, w, 2, 12, 11)})
		}, 2, true, true},
		{"events of an unknown relay, ahead of the heads", func(t *testing.T, l *loop) {
			for id := range uint64(5) {
				l.handleEvent(&nats.Msg{Data: eventMsg(t, w, id+1, kvroute.ExternalHash(11+id), kvroute.ExternalHash(10+id))})
			}
		}, 2, true, true},
		{"marker naming no relay, then events", func(t *testing.T, l *loop) {
			l.handleEvent(markerMsg(t, w, 0))
			l.handleEvent(&nats.Msg{Data: eventMsg(t, w, 1, 11, 0)})
			l.handleEvent(&nats.Msg{Data: eventMsg(t, w, 2, 12, 11)})
		}, 2, true, true},
		{"a dump without the relay", func(t *testing.T, l *loop) {
			l.handleEvent(&nats.Msg{Data: eventMsg(t, w, 1, 11, 0)})
			l.last[w] = 9 // as a peer's dump without epochs leaves it
		}, 9, true, true},
		{"marker naming no relay, nothing applied", func(t *testing.T, l *loop) {
			l.handleEvent(markerMsg(t, w, 0))
		}, 0, false, false},
		{"a worker never seen", func(t *testing.T, l *loop) {}, 4, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newReplicaHarness(t)
			l, end, ix, _ := h.newLoop(t)
			defer end()
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // repairs give up at once: the test looks at what was started
			l.ctx = ctx
			tt.before(t, l)
			blocks, last := len(ix.AppendWorkerBlocks(w, nil)), l.last[w]
			l.handleHeads(appendHeads(nil, &heads{epoch: relay, last: []workerID{{worker: w, id: tt.head}}}))
			require.Equal(t, uint64(relay), l.epochs[w], "the replica follows the relay")
			if tt.resync {
				require.Empty(t, ix.AppendWorkerBlocks(w, nil), "the worker kept the blocks of an unknown sequence")
				require.Zero(t, l.last[w])
			} else {
				require.Len(t, ix.AppendWorkerBlocks(w, nil), blocks)
				require.Equal(t, last, l.last[w])
			}
			if !tt.repairs {
				require.Nil(t, l.repairs[w])
				return
			}
			require.NotNil(t, l.repairs[w], "no repair")
			require.Equal(t, tt.head, l.repairs[w].need)
		})
	}
}
