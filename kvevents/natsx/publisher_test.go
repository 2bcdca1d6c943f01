package natsx

import (
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
)

// pubHarness is a Publisher with Serve running on an in-process server,
// and a connection to ask it for replays.
type pubHarness struct {
	t   *testing.T
	pub *Publisher
	nc  *nats.Conn
}

func newPubHarness(t *testing.T, cfg PublisherConfig) *pubHarness {
	nc := startServer(t)
	cfg.Conn = nc
	if cfg.HeadsInterval == 0 {
		cfg.HeadsInterval = 10 * time.Millisecond
	}
	pub, err := NewPublisher(cfg)
	require.NoError(t, err)
	runUntilEnd(t, pub.Serve)
	h := &pubHarness{t: t, pub: pub, nc: nc}
	h.heads() // Serve has subscribed to replay requests before it publishes heads
	return h
}

// store publishes a Stored event of blocks blocks on w.
func (h *pubHarness) store(w kvroute.WorkerKey, blocks int) {
	ev := kvroute.Event{Kind: kvroute.EventStored, Worker: w, Blocks: make([]kvroute.StoredBlock, blocks)}
	for i := range ev.Blocks {
		ev.Blocks[i] = kvroute.StoredBlock{External: kvroute.ExternalHash(i + 1), Hash: kvroute.BlockHash(i + 1)}
	}
	require.NoError(h.t, h.pub.Apply(&ev))
}

// replayAnswer is the relay's answer to a replay request.
type replayAnswer struct {
	ok    bool
	ids   []uint64 // the event IDs of the messages
	bytes int      // their size
}

// replay asks for w's events from..to; answered is false when the relay
// did not answer.
func (h *pubHarness) replay(w kvroute.WorkerKey, from, to uint64) (replayAnswer, bool) {
	return h.replayWithin(w, from, to, 5*time.Second)
}

// unanswered reports whether a replay request for w's events from..to
// gets no answer within 200 ms.
func (h *pubHarness) unanswered(w kvroute.WorkerKey, from, to uint64) bool {
	_, answered := h.replayWithin(w, from, to, 200*time.Millisecond)
	return !answered
}

// replayWithin asks the relay for w's events from..to and waits up to
// wait for the answer; false when none came.
func (h *pubHarness) replayWithin(w kvroute.WorkerKey, from, to uint64, wait time.Duration) (replayAnswer, bool) {
	var a replayAnswer
	m, err := h.nc.Request(replaySubject(DefaultPrefix), appendReplayReq(nil, &replayReq{worker: w, from: from, to: to}), wait)
	if err != nil {
		return a, false
	}
	c, err := decodeReplayChunk(m.Data)
	require.NoError(h.t, err)
	require.True(h.t, c.final, "a single chunk")
	a.ok = c.ok
	for _, msg := range c.msgs {
		var d kvevents.DynamoEvent
		_, err := kvevents.DecodeDynamoEvent(msg, &d)
		require.NoError(h.t, err)
		require.Equal(h.t, w, kvroute.WorkerKey{ID: kvroute.WorkerID(d.WorkerID), Rank: kvroute.DPRank(d.DPRank)})
		a.ids = append(a.ids, d.EventID+1)
		a.bytes += len(msg)
	}
	return a, true
}

// heads returns the last IDs the Publisher announces next.
func (h *pubHarness) heads() map[kvroute.WorkerKey]uint64 {
	sub, err := h.nc.SubscribeSync(headsSubject(DefaultPrefix))
	require.NoError(h.t, err)
	defer func() { _ = sub.Unsubscribe() }()
	m, err := sub.NextMsg(5 * time.Second)
	require.NoError(h.t, err)
	hd, err := decodeHeads(m.Data)
	require.NoError(h.t, err)
	out := map[kvroute.WorkerKey]uint64{}
	for _, x := range hd.last {
		out[x.worker] = x.id
	}
	return out
}

// held checks that the relay answers for w's events from..to with exactly
// those, and returns their size.
func (h *pubHarness) held(w kvroute.WorkerKey, from, to uint64) int {
	a, answered := h.replay(w, from, to)
	require.True(h.t, answered, "%s %d..%d", w, from, to)
	require.True(h.t, a.ok, "%s %d..%d not held", w, from, to)
	var want []uint64
	for id := from; id <= to; id++ {
		want = append(want, id)
	}
	require.Equal(h.t, want, a.ids)
	return a.bytes
}

// gone checks that the relay answers for w's events from..to that it no
// longer holds them: no stale messages.
func (h *pubHarness) gone(w kvroute.WorkerKey, from, to uint64) {
	a, answered := h.replay(w, from, to)
	require.True(h.t, answered, "no answer for %s %d..%d", w, from, to)
	require.False(h.t, a.ok, "%s %d..%d still held", w, from, to)
	require.Empty(h.t, a.ids)
}

// A worker's replay buffer is released when the worker is reset (up to
// the reset) or removed, idle past ReplayIdle, or when the buffers pass
// ReplayBytes; replay requests for what was released get the answer that
// the relay no longer holds it, and what is still held is exactly what
// Stats counts.
func TestPublisherReleasesReplayBuffers(t *testing.T) {
	w1, w2 := kvroute.WorkerKey{ID: 1}, kvroute.WorkerKey{ID: 2, Rank: 1}
	tests := []struct {
		name string
		cfg  PublisherConfig
		run  func(t *testing.T, h *pubHarness)
	}{
		{"reset releases the events before it", PublisherConfig{}, func(t *testing.T, h *pubHarness) {
			for range 5 {
				h.store(w1, 4)
				h.store(w2, 4)
			}
			h.pub.ResetWorker(w1) // ID 6
			h.store(w1, 4)        // ID 7
			h.gone(w1, 1, 5)
			// A replay from before the reset starts at the reset, which
			// clears the worker anyway.
			for _, from := range []uint64{1, 5} {
				a, answered := h.replay(w1, from, 7)
				require.True(t, answered)
				require.True(t, a.ok)
				require.Equal(t, []uint64{6, 7}, a.ids)
			}
			kept := h.held(w1, 6, 7) + h.held(w2, 1, 5)
			require.Equal(t, PublisherStats{Workers: 2, Buffered: 2, BufferedBytes: kept}, h.pub.Stats())
		}},
		{"removed worker", PublisherConfig{ReplayIdle: 2 * time.Second}, func(t *testing.T, h *pubHarness) {
			for range 5 {
				h.store(w1, 4)
				h.store(w2, 4)
			}
			h.pub.RemoveWorker(w1)
			h.gone(w1, 1, 5)
			kept := h.held(w2, 1, 5)
			require.Equal(t, PublisherStats{Workers: 1, Buffered: 1, BufferedBytes: kept, Released: 1}, h.pub.Stats())
			require.Equal(t, map[kvroute.WorkerKey]uint64{w2: 5}, h.heads())
			// After ReplayIdle the worker is forgotten: its requests are
			// left to other relays.
			require.Eventually(t, func() bool { return h.unanswered(w1, 1, 5) },
				10*time.Second, 20*time.Millisecond)
			// It comes back: a new sequence.
			h.store(w1, 4)
			h.held(w1, 1, 1)
			h.gone(w1, 1, 2)
			require.Equal(t, map[kvroute.WorkerKey]uint64{w1: 1, w2: 5}, h.heads())
		}},
		{"idle worker", PublisherConfig{ReplayIdle: time.Second}, func(t *testing.T, h *pubHarness) {
			for range 5 {
				h.store(w1, 4)
			}
			deadline := time.Now().Add(10 * time.Second)
			for h.pub.Stats().Buffered != 1 || h.pub.Stats().Released != 1 {
				require.True(t, time.Now().Before(deadline), "w1's buffer never released: %+v", h.pub.Stats())
				h.store(w2, 4) // w2 stays active
				time.Sleep(20 * time.Millisecond)
			}
			h.gone(w1, 1, 5)
			st := h.pub.Stats()
			require.Equal(t, 2, st.Workers)
			last := h.heads()[w2]
			require.Equal(t, st.BufferedBytes, h.held(w2, 1, last))
			// Its numbering stays: the next event continues the sequence.
			require.Equal(t, uint64(5), h.heads()[w1])
			h.store(w1, 4)
			h.held(w1, 6, 6)
			h.gone(w1, 5, 6)
		}},
		{"byte bound: least recently active first", PublisherConfig{ReplayBytes: 6 << 10}, func(t *testing.T, h *pubHarness) {
			for range 4 {
				h.store(w1, 10) // about 600 bytes each
			}
			for range 4 {
				h.store(w2, 10)
			}
			require.Equal(t, h.held(w1, 1, 4)+h.held(w2, 1, 4), h.pub.Stats().BufferedBytes)
			t.Logf("%d bytes an event", h.pub.Stats().BufferedBytes/8)
			for range 6 {
				h.store(w2, 10)
			}
			h.gone(w1, 1, 4)
			st := h.pub.Stats()
			require.LessOrEqual(t, st.BufferedBytes, 6<<10)
			require.Equal(t, 1, st.Buffered)
			require.Equal(t, st.BufferedBytes, h.held(w2, 1, 10))
			// The publishing worker alone past the bound: its oldest go.
			for range 10 {
				h.store(w2, 10)
			}
			st = h.pub.Stats()
			require.LessOrEqual(t, st.BufferedBytes, 6<<10)
			require.Greater(t, st.BufferedBytes, 4<<10)
			first := uint64(1)
			for ; first <= 20; first++ { // the oldest still held
				if a, _ := h.replay(w2, first, 20); a.ok {
					break
				}
			}
			require.Greater(t, first, uint64(1))
			require.Equal(t, st.BufferedBytes, h.held(w2, first, 20))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.run(t, newPubHarness(t, tt.cfg))
		})
	}
}

// heapAlloc returns the bytes of live heap objects after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// The memory of removed workers' buffers is returned to the heap.
func TestPublisherRemoveWorkerFreesMemory(t *testing.T) {
	h := newPubHarness(t, PublisherConfig{})
	const workers, events, blocks = 8, 100, 800 // about 40 KB an event, 32 MB in all
	base := heapAlloc()
	for w := range kvroute.WorkerID(workers) {
		for range events {
			h.store(kvroute.WorkerKey{ID: w}, blocks)
		}
	}
	held := h.pub.Stats().BufferedBytes
	require.Greater(t, held, 24<<20)
	full := heapAlloc()
	require.Greater(t, full, base+uint64(held)*3/4, "the buffers are not on the heap")
	for w := range kvroute.WorkerID(workers) {
		h.pub.RemoveWorker(kvroute.WorkerKey{ID: w})
	}
	require.Zero(t, h.pub.Stats().BufferedBytes)
	after := heapAlloc()
	require.Less(t, after, full-uint64(held)*3/4, "heap %d MB full, %d MB after removing every worker", full>>20, after>>20)
}
