package zmq_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/zmqtest"
	"github.com/kvroute/kvroute/kvevents"
	kvzmq "github.com/kvroute/kvroute/kvevents/zmq"
)

// engine is a minimal vLLM-style publisher in Go: a PUB socket and a
// replay ROUTER over a buffer the test controls.
type engine struct {
	t          *testing.T
	pub        zmq4.Socket
	router     zmq4.Socket
	topicFrame bool
	mu         sync.Mutex
	buffer     map[uint64][]byte // seq -> payload, what replay can serve
}

func newEngine(t *testing.T, ctx context.Context, topicFrame bool) (*engine, string, string) {
	e := &engine{t: t, pub: zmq4.NewPub(ctx), router: zmq4.NewRouter(ctx), topicFrame: topicFrame, buffer: map[uint64][]byte{}}
	pubPort, replayPort := freePorts(t, 1), freePorts(t, 1)
	pubEP, replayEP := fmt.Sprintf("tcp://127.0.0.1:%d", pubPort), fmt.Sprintf("tcp://127.0.0.1:%d", replayPort)
	require.NoError(t, e.pub.Listen(pubEP))
	require.NoError(t, e.router.Listen(replayEP))
	go e.serveReplay()
	t.Cleanup(func() { e.pub.Close(); e.router.Close() })
	return e, pubEP, replayEP
}

func (e *engine) serveReplay() {
	for {
		m, err := e.router.Recv()
		if err != nil {
			return
		}
		if len(m.Frames) != 3 || len(m.Frames[2]) != 8 {
			continue
		}
		id, start := m.Frames[0], binary.BigEndian.Uint64(m.Frames[2])
		e.mu.Lock()
		var seqs []uint64
		for s := range e.buffer {
			if s >= start {
				seqs = append(seqs, s)
			}
		}
		slicesSort(seqs)
		for _, s := range seqs {
			_ = e.router.SendMulti(e.reply(id, s, e.buffer[s]))
		}
		e.mu.Unlock()
		_ = e.router.SendMulti(e.reply(id, ^uint64(0), []byte{}))
	}
}

func (e *engine) reply(id []byte, seq uint64, payload []byte) zmq4.Msg {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	frames := [][]byte{id, {}}
	if e.topicFrame {
		frames = append(frames, []byte("kv"))
	}
	return zmq4.NewMsgFrom(append(frames, b[:], payload)...)
}

// publish sends batch seq storing one root block whose external hash is
// ext; live false keeps it off the PUB socket, buffered false off the
// replay buffer.
func (e *engine) publish(seq, ext uint64, live, buffered bool) {
	payload, err := kvevents.AppendBatch(nil, &kvevents.Batch{Timestamp: 1, RankSlot: true, DPRank: kvevents.Some(0),
		Events: []kvevents.EngineEvent{{Type: kvevents.BlockStored, Layout: kvevents.LayoutMap, BlockSize: 4,
			BlockHashes: []kvevents.Hash{kvevents.UintHash(ext)}, TokenIDs: []uint32{uint32(ext), 1, 2, 3}}}})
	require.NoError(e.t, err)
	e.mu.Lock()
	if buffered {
		e.buffer[seq] = payload
	}
	e.mu.Unlock()
	if live {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], seq)
		require.NoError(e.t, e.pub.SendMulti(zmq4.NewMsgFrom([]byte("kv"), b[:], payload)))
	}
}

func slicesSort(s []uint64) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// recorder is a Sink that keeps the external hashes each worker holds.
type recorder struct {
	mu     sync.Mutex
	held   map[kvroute.ExternalHash]bool
	lastID uint64
	resets int
	bad    error
}

func (r *recorder) Apply(ev *kvroute.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ev.ID != r.lastID+1 && r.bad == nil {
		r.bad = fmt.Errorf("event id %d after %d", ev.ID, r.lastID)
	}
	r.lastID = ev.ID
	for _, b := range ev.Blocks {
		r.held[b.External] = true
	}
	return nil
}

func (r *recorder) ResetWorker(kvroute.WorkerKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resets++
	clear(r.held)
}

func (r *recorder) snapshot() (map[kvroute.ExternalHash]bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[kvroute.ExternalHash]bool, len(r.held))
	for k := range r.held {
		out[k] = true
	}
	return out, r.resets
}

func TestSubscriberGapsReplayLossAndRestart(t *testing.T) {
	tests := []struct {
		name       string
		topicFrame bool
		// publish runs the scenario; want is the final set of blocks.
		publish     func(e *engine)
		want        []uint64
		wantResets  int // besides the reset of the worker when it is first seen
		wantDropped uint64
	}{
		{
			name: "drops are replayed",
			publish: func(e *engine) {
				for s := uint64(1); s < 12; s++ {
					e.publish(s, 100+s, s != 1 && s != 4 && s != 5 && s != 11, true)
				}
			},
			want: []uint64{100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111},
		},
		{
			name:       "replies with a topic frame",
			topicFrame: true,
			publish: func(e *engine) {
				for s := uint64(1); s < 6; s++ {
					e.publish(s, 100+s, s != 2, true)
				}
			},
			want: []uint64{100, 101, 102, 103, 104, 105},
		},
		{
			name: "lost batches reset the worker",
			publish: func(e *engine) {
				for s := uint64(1); s < 8; s++ {
					e.publish(s, 100+s, s != 4, s != 4)
				}
			},
			want:        []uint64{105, 106, 107},
			wantResets:  1,
			wantDropped: 1,
		},
		{
			name: "a restart resets the worker",
			publish: func(e *engine) {
				for s := uint64(1); s < 5; s++ {
					e.publish(s, 100+s, true, true)
				}
				time.Sleep(100 * time.Millisecond)
				e.mu.Lock()
				clear(e.buffer)
				e.mu.Unlock()
				for s := range uint64(3) {
					e.publish(s, 200+s, true, true)
				}
			},
			want:       []uint64{200, 201, 202},
			wantResets: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			e, pubEP, replayEP := newEngine(t, ctx, tt.topicFrame)
			rec := &recorder{held: map[kvroute.ExternalHash]bool{}}
			sub, err := kvzmq.New(kvzmq.Config{Endpoint: pubEP, ReplayEndpoint: replayEP, Topic: "kv",
				Converter: kvevents.ConverterConfig{Worker: 1, BlockSize: 4}, Sink: rec,
				IdleTimeout: 300 * time.Millisecond, ReplayTimeout: time.Second, MaxBackoff: 100 * time.Millisecond})
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() { done <- sub.Run(ctx) }()
			// Wait for the subscription to reach the publisher: send batch 0
			// until it arrives (a probe sent before is dropped by PUB); the
			// scenarios go on from batch 1.
			for sub.Stats().Received == 0 {
				e.publish(0, 100, true, true)
				select {
				case <-ctx.Done():
					t.Fatal("subscriber never received a message")
				case <-time.After(20 * time.Millisecond):
				}
			}
			tt.publish(e)
			want := map[kvroute.ExternalHash]bool{}
			for _, x := range tt.want {
				want[kvroute.ExternalHash(x)] = true
			}
			for {
				held, resets := rec.snapshot()
				if fmt.Sprint(held) == fmt.Sprint(want) && resets == tt.wantResets+1 {
					break
				}
				select {
				case <-ctx.Done():
					t.Fatalf("held %v with %d resets, want %v with %d (stats %+v)", held, resets, want, tt.wantResets+1, sub.Stats())
				case <-time.After(20 * time.Millisecond):
				}
			}
			require.NoError(t, rec.bad)
			require.Equal(t, tt.wantDropped, sub.Stats().Dropped)
			require.ErrorIs(t, sub.Run(ctx), kvzmq.ErrRunning)
			cancel()
			require.NoError(t, <-done)
		})
	}
}

func TestNewValidates(t *testing.T) {
	sink := &recorder{}
	for _, cfg := range []kvzmq.Config{
		{Sink: sink},
		{Endpoint: "tcp://127.0.0.1:1"},
		{Endpoint: "tcp://127.0.0.1:1", Sink: sink, Converter: kvevents.ConverterConfig{BlockSize: -1}},
	} {
		_, err := kvzmq.New(cfg)
		require.ErrorIs(t, err, kvzmq.ErrConfig)
	}
}

// A publisher that restarts after an idle spell, when the idle replay has
// already fetched the end of its last burst, is seen to restart: its new
// batches are applied and its old blocks forgotten, although their
// sequence numbers sit below the replayed ones.
// runSubscriber runs a subscriber of worker 1's batches on pubEP, with the
// replay socket replayEP and idle timeout idle, into rec until the test
// ends.
func runSubscriber(t *testing.T, ctx context.Context, pubEP, replayEP string, rec *recorder, idle time.Duration) *kvzmq.Subscriber {
	t.Helper()
	sub, err := kvzmq.New(kvzmq.Config{Endpoint: pubEP, ReplayEndpoint: replayEP, Topic: "kv",
		Converter: kvevents.ConverterConfig{Worker: 1, BlockSize: 4}, Sink: rec,
		IdleTimeout: idle, ReplayTimeout: time.Second, MaxBackoff: 100 * time.Millisecond})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	return sub
}

func TestSubscriberRestartAfterIdleReplay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	e, pubEP, replayEP := newEngine(t, ctx, false)
	rec := &recorder{held: map[kvroute.ExternalHash]bool{}}
	sub := runSubscriber(t, ctx, pubEP, replayEP, rec, 400*time.Millisecond)
	for sub.Stats().Received == 0 {
		e.publish(0, 100, true, true)
		time.Sleep(20 * time.Millisecond)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		e.publish(seq, 100+seq, false, true) // the end of a burst, lost on the PUB socket
	}
	waitFor(t, ctx, func() bool { return sub.Stats().Replayed >= 3 }, "the idle replay")

	// The engine restarts and counts from 0 again.
	e.mu.Lock()
	clear(e.buffer)
	e.mu.Unlock()
	e.publish(0, 200, false, true)
	e.publish(1, 201, false, true)
	reconnects := sub.Stats().Reconnects
	waitFor(t, ctx, func() bool { return sub.Stats().Reconnects > reconnects }, "a reconnect")
	received := sub.Stats().Received
	seq := uint64(2)
	for ; sub.Stats().Received == received; seq++ {
		e.publish(seq, 200+seq, true, true) // until the new connection hears one
		time.Sleep(20 * time.Millisecond)
	}
	waitFor(t, ctx, func() bool {
		held, _ := rec.snapshot()
		return held[200] && held[201] && held[200+kvroute.ExternalHash(seq)-1]
	}, "the restarted engine's blocks")
	held, resets := rec.snapshot()
	for ext := range held {
		require.GreaterOrEqual(t, ext, kvroute.ExternalHash(200), "an old block is still held; stats %+v", sub.Stats())
	}
	require.Positive(t, resets)
	require.Equal(t, uint64(1), sub.Stats().Restarts)
}

// A peer that accepts connections and never speaks ZMTP neither stalls
// the subscriber nor keeps Run from returning: a silent replay endpoint
// counts as unreachable (the worker is reset and the live stream goes
// on), and a silent publisher is retried until Run's context ends.
func TestSubscriberSilentPeers(t *testing.T) {
	t.Run("replay endpoint", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		e, pubEP, _ := newEngine(t, ctx, false)
		rec := &recorder{held: map[kvroute.ExternalHash]bool{}}
		sub, err := kvzmq.New(kvzmq.Config{Endpoint: pubEP, ReplayEndpoint: zmqtest.SilentPeer(t, nil), Topic: "kv",
			Converter: kvevents.ConverterConfig{Worker: 1, BlockSize: 4}, Sink: rec, ReplayTimeout: 300 * time.Millisecond})
		require.NoError(t, err)
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- sub.Run(runCtx) }()
		for sub.Stats().Received == 0 {
			e.publish(0, 100, true, true)
			time.Sleep(20 * time.Millisecond)
		}
		e.publish(1, 101, false, true) // lost: a gap at 1
		e.publish(2, 102, true, true)
		e.publish(3, 103, true, true)
		waitFor(t, ctx, func() bool { held, _ := rec.snapshot(); return held[102] && held[103] }, "the live stream after the gap")
		_, resets := rec.snapshot()
		require.Positive(t, resets, "the gap's events are lost: the worker is reset")
		stop()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
	})
	t.Run("publisher", func(t *testing.T) {
		sub, err := kvzmq.New(kvzmq.Config{Endpoint: zmqtest.SilentPeer(t, nil), Topic: "kv",
			Converter: kvevents.ConverterConfig{Worker: 1, BlockSize: 4}, Sink: &recorder{held: map[kvroute.ExternalHash]bool{}},
			ReplayTimeout: 200 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- sub.Run(ctx) }()
		time.Sleep(700 * time.Millisecond)
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
		require.Zero(t, sub.Stats().Reconnects, "a silent peer is no connection")
	})
}

// TestSubscriberIdleReplayBeforeAnyMessage: batches an engine published
// before the subscription took effect, after which it went quiet, are
// fetched from its replay buffer once the subscriber has heard nothing
// for IdleTimeout; and an engine that restarts after that is followed.
func TestSubscriberIdleReplayBeforeAnyMessage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	e, pubEP, replayEP := newEngine(t, ctx, false)
	// Published before anyone subscribed: in the replay buffer only.
	e.publish(0, 100, false, true)
	e.publish(1, 101, false, true)
	rec := &recorder{held: map[kvroute.ExternalHash]bool{}}
	sub := runSubscriber(t, ctx, pubEP, replayEP, rec, 300*time.Millisecond)
	waitFor(t, ctx, func() bool {
		held, _ := rec.snapshot()
		return held[100] && held[101]
	}, "the blocks published before the subscription")
	require.Zero(t, sub.Stats().Received)

	// The engine restarts and counts from 0 again, live this time.
	e.mu.Lock()
	clear(e.buffer)
	e.mu.Unlock()
	seq := uint64(0)
	for held, _ := rec.snapshot(); !held[200]; held, _ = rec.snapshot() {
		e.publish(seq, 200+seq, true, true) // until the connection hears one
		seq++
		select {
		case <-ctx.Done():
			t.Fatalf("the restarted engine is not followed; stats %+v", sub.Stats())
		case <-time.After(20 * time.Millisecond):
		}
	}
	held, resets := rec.snapshot()
	require.False(t, held[100] || held[101], "the old engine's blocks are still held")
	require.Positive(t, resets)
	require.Equal(t, uint64(1), sub.Stats().Restarts)
}
