package zmq

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/internal/zmqdial"
	"github.com/kvroute/kvroute/kvevents"
)

// Errors returned by New and Run.
var (
	// ErrConfig is wrapped by New for an invalid Config.
	ErrConfig = errors.New("zmq: invalid configuration")
	// ErrRunning is returned by Run when the Subscriber is already running.
	ErrRunning = errors.New("zmq: subscriber already running")
)

// Defaults of Config's durations.
const (
	DefaultIdleTimeout   = 5 * time.Second
	DefaultReplayTimeout = 2 * time.Second
	DefaultMaxBackoff    = 5 * time.Second
	minBackoff           = 50 * time.Millisecond
	// queueLen is the number of received messages buffered between the
	// socket reader and the loop that applies them.
	queueLen = 1024
)

// endSeq is the replay end marker: sequence -1 as 8 signed bytes.
const endSeq = ^uint64(0)

// Config configures a Subscriber.
type Config struct {
	// Endpoint is the engine's ZMQ PUB endpoint to connect to, such as
	// "tcp://127.0.0.1:5557". Required.
	Endpoint string
	// ReplayEndpoint is the engine's replay ROUTER endpoint, such as
	// "tcp://127.0.0.1:5558". Empty disables replay: every gap then
	// resets the worker.
	ReplayEndpoint string
	// Topic is the topic prefix to subscribe to. Empty receives every
	// topic (vLLM's default topic is empty; its CLI often uses
	// "kv-events").
	Topic string
	// Converter configures decoding: the worker id, block size and hasher
	// namespace of the engine.
	Converter kvevents.ConverterConfig
	// Sink receives the events, numbered consecutively per worker. It is
	// called from Run's goroutine only. Required.
	Sink kvevents.Sink
	// Logger receives records of gaps, replays, resets and reconnects.
	// Nil discards.
	Logger *slog.Logger
	// IdleTimeout is how long the subscriber waits without a message
	// before it asks the replay socket for anything it missed (a batch
	// dropped at the end of a burst shows no gap until the next one) and
	// reconnects, in case the publisher went away. Zero means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// ReplayTimeout bounds the wait for each replay reply, and each
	// connection's handshake (a peer that accepts connections but never
	// speaks ZMTP is given up on after it). Zero means
	// DefaultReplayTimeout.
	ReplayTimeout time.Duration
	// MaxBackoff bounds the wait between reconnection attempts. Zero means
	// DefaultMaxBackoff.
	MaxBackoff time.Duration
}

// Stats counts what a Subscriber did. All fields only grow.
type Stats struct {
	Received   uint64 // batches received on the PUB socket, counted once handled
	Replayed   uint64 // batches recovered through the replay socket
	Applied    uint64 // events applied to the sink without error
	Gaps       uint64 // sequence gaps seen
	Dropped    uint64 // batches lost for good (the worker was reset)
	Duplicates uint64 // batches received again and skipped
	// Malformed are batches (or messages) that did not decode and were
	// skipped. A skipped batch does not reset the worker: the blocks it
	// stored are missing from the index until the engine stores them
	// again, and the blocks it removed stay indexed until the engine
	// removes or clears them again (routing may then predict a few hits
	// the engine no longer has).
	Malformed uint64
	ApplyErrs uint64 // events the sink returned an error for
	// UnknownParents are stored events the sink rejected because it does
	// not know their parent block (a subset of ApplyErrs).
	UnknownParents uint64
	Restarts       uint64 // publisher restarts detected (sequence went back)
	Resets         uint64 // worker resets sent to the sink
	Reconnects     uint64 // connections (re)established to the PUB endpoint
	// Applied events per kind (a subset of Applied).
	AppliedStored, AppliedRemoved, AppliedCleared uint64
	// Convert is what conversion left out (skipped groups, block-size
	// rejects, re-chunked events, unknown LoRA ids, ...).
	Convert kvevents.ConvertStats
}

// Subscriber applies the KV events one engine publishes over ZMQ (vLLM's
// and SGLang's framing: topic, 8-byte big-endian sequence number, payload)
// to a Sink, in order, repairing sequence gaps through the engine's replay
// socket.
//
// Sequence handling: the subscriber expects sequence numbers to grow by
// one. On a gap it asks the replay socket for everything from the first
// missing number and applies what comes back in order; when the replay
// buffer no longer has the missing batches (the first reply is later than
// asked, or replay is off or times out) it calls Sink.ResetWorker for
// every worker of this engine and goes on. A live sequence number not
// above the last live one means the publisher restarted (vLLM counts from
// 0 again): the workers are reset. Events are handed to the sink with IDs
// numbered consecutively per worker by the subscriber, so that the
// indexer's sequence checks hold across all of this.
//
// A batch that does not decode (or whose rank is out of range) is counted
// in Stats.Malformed and skipped; it never resets the worker, so valid
// state is never lost to bad input. Its own blocks are what it costs:
// those it stored are missing until the engine stores them again, those
// it removed stay indexed until removed or cleared again. Events the
// converter leaves out (see kvevents.Converter) are counted in
// Stats.Convert.
//
// A Subscriber does nothing until the host calls Run, and stops when Run's
// context ends. Stats may be called from any goroutine.
type Subscriber struct {
	cfg     Config
	log     *slog.Logger
	conv    *kvevents.Converter
	running atomic.Bool

	// Loop state, owned by Run's goroutine.
	next     uint64 // sequence number expected next
	started  bool   // next is meaningful
	lastLive uint64 // last sequence number seen on the PUB socket
	haveLive bool
	ids      map[kvroute.WorkerKey]uint64 // last event ID per worker
	batch    kvevents.Batch
	evs      []kvroute.Event

	stats struct {
		received, replayed, applied, gaps, dropped atomic.Uint64
		duplicates, malformed, applyErrs, restarts atomic.Uint64
		reconnects, resets, unknownParents         atomic.Uint64
		stored, removed, cleared                   atomic.Uint64
	}
	convMu    sync.Mutex
	convStats kvevents.ConvertStats // copy of conv.Stats(), under convMu
}

// New returns a Subscriber for cfg. It returns an error wrapping ErrConfig
// when the endpoint or sink is missing or the converter configuration is
// invalid. It does not connect.
func New(cfg Config) (*Subscriber, error) {
	if cfg.Endpoint == "" {
		return nil, fmt.Errorf("%w: no endpoint", ErrConfig)
	}
	if cfg.Sink == nil {
		return nil, fmt.Errorf("%w: no sink", ErrConfig)
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = DefaultReplayTimeout
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cc := cfg.Converter
	if cc.Logger == nil {
		cc.Logger = log
	}
	conv, err := kvevents.NewConverter(cc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return &Subscriber{
		cfg:  cfg,
		log:  log.With("endpoint", cfg.Endpoint),
		conv: conv,
		ids:  make(map[kvroute.WorkerKey]uint64),
	}, nil
}

// Stats returns the subscriber's counters.
func (s *Subscriber) Stats() Stats {
	return Stats{
		Received:   s.stats.received.Load(),
		Replayed:   s.stats.replayed.Load(),
		Applied:    s.stats.applied.Load(),
		Gaps:       s.stats.gaps.Load(),
		Dropped:    s.stats.dropped.Load(),
		Duplicates: s.stats.duplicates.Load(),
		Malformed:  s.stats.malformed.Load(),
		ApplyErrs:  s.stats.applyErrs.Load(),
		Restarts:   s.stats.restarts.Load(),
		Reconnects: s.stats.reconnects.Load(),

		UnknownParents: s.stats.unknownParents.Load(),
		Resets:         s.stats.resets.Load(),
		AppliedStored:  s.stats.stored.Load(),
		AppliedRemoved: s.stats.removed.Load(),
		AppliedCleared: s.stats.cleared.Load(),
		Convert:        s.convertStats(),
	}
}

func (s *Subscriber) convertStats() kvevents.ConvertStats {
	s.convMu.Lock()
	defer s.convMu.Unlock()
	return s.convStats
}

// Run connects to the publisher and applies its events until ctx ends,
// reconnecting (with backoff up to MaxBackoff) whenever the connection
// cannot be made or stays idle for IdleTimeout. It returns nil when ctx
// ends, or ErrRunning if Run is already running. The goroutines it starts
// have ended when it returns.
func (s *Subscriber) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer s.running.Store(false)
	backoff := minBackoff
	for ctx.Err() == nil {
		connected, err := s.session(ctx)
		if err != nil && ctx.Err() == nil {
			s.log.Debug("zmq: session ended", "err", err)
		}
		if connected {
			backoff = minBackoff
			continue
		}
		if !sleep(ctx, backoff) {
			break
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
	return nil
}

// session runs one SUB connection until ctx ends or it stays idle. It
// reports whether it connected.
func (s *Subscriber) session(ctx context.Context) (bool, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(sctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.ReplayTimeout))
	defer sub.Close()
	if err := zmqdial.Dial(sctx, sub, s.cfg.Endpoint, s.cfg.ReplayTimeout); err != nil {
		return false, err
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return false, err
	}
	s.stats.reconnects.Add(1)
	s.log.Debug("zmq: connected")
	msgs := make(chan zmq4.Msg, queueLen)
	done := make(chan error, 1)
	go func() { done <- recvLoop(sctx, sub, msgs) }()
	defer func() {
		cancel()
		sub.Close()
		<-done
	}()

	idle := time.NewTimer(s.cfg.IdleTimeout)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return true, nil
		case err := <-done:
			done <- err // for the deferred wait
			return true, err
		case m := <-msgs:
			s.handleLive(ctx, m.Frames)
			idle.Reset(s.cfg.IdleTimeout)
		case <-idle.C:
			// Nothing for a while: fetch anything dropped at the end of the
			// last burst, then reconnect in case the publisher is gone.
			// Before the first message, fetch what the engine published
			// before the subscription took effect (a PUB socket drops what
			// it sends before it has the subscription): an engine that
			// goes quiet after its first burst would otherwise be heard
			// only at its next batch.
			if s.cfg.ReplayEndpoint != "" {
				if !s.started {
					s.next, s.started = 0, true
				}
				s.replay(ctx, s.next, 0)
			}
			return true, nil
		}
	}
}

// recvLoop forwards received messages until the socket fails or ctx ends.
func recvLoop(ctx context.Context, sock zmq4.Socket, out chan<- zmq4.Msg) error {
	for {
		m, err := sock.Recv()
		if err != nil {
			return err
		}
		select {
		case out <- m:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// handleLive processes one message from the PUB socket.
func (s *Subscriber) handleLive(ctx context.Context, frames [][]byte) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		s.stats.malformed.Add(1)
		s.log.Warn("zmq: message with unexpected framing", "frames", len(frames))
		return
	}
	if !strings.HasPrefix(string(frames[0]), s.cfg.Topic) {
		return
	}
	seq := binary.BigEndian.Uint64(frames[1])
	payload := frames[2]
	// Counted once handled: whoever sees Received reach n sees the other
	// counters and the sink with those n batches.
	defer s.stats.received.Add(1)
	if s.haveLive && seq <= s.lastLive || s.started && seq < s.next {
		// The live stream only moves forward: the publisher restarted and
		// counts from 0 again. (A replay after an idle spell, which ends
		// the connection, may have taken s.next past the last live
		// message, or started the stream before any: a live message below
		// it is no duplicate then, since replays follow the live stream.)
		s.stats.restarts.Add(1)
		s.log.Info("zmq: publisher restarted", "seq", seq, "last", s.lastLive)
		s.resetWorkers()
		s.next, s.started = 0, true
	}
	s.lastLive, s.haveLive = seq, true
	if !s.started {
		// The first message: with a replay socket, fetch what the engine
		// published before we joined (as far as its buffer reaches).
		s.next, s.started = seq, true
		if s.cfg.ReplayEndpoint != "" {
			s.next = 0
		}
	}
	switch {
	case seq < s.next:
		s.stats.duplicates.Add(1) // already applied from a replay
		return
	case seq > s.next:
		s.stats.gaps.Add(1)
		s.log.Info("zmq: sequence gap", "want", s.next, "got", seq)
		s.replay(ctx, s.next, seq)
		if ctx.Err() != nil {
			return // shutting down: nothing was lost, the replay was cut short
		}
		if seq < s.next {
			s.stats.duplicates.Add(1)
			return
		}
		if seq > s.next {
			// Still missing: the replay buffer does not have them.
			s.lose(s.next, seq)
		}
	}
	s.apply(payload)
	s.next = seq + 1
}

// lose gives up on batches [from, to): the workers are reset.
func (s *Subscriber) lose(from, to uint64) {
	s.stats.dropped.Add(to - from)
	s.log.Warn("zmq: batches lost, resetting workers", "from", from, "to", to)
	s.resetWorkers()
	s.next = to
}

func (s *Subscriber) resetWorkers() {
	for w := range s.ids {
		s.stats.resets.Add(1)
		s.cfg.Sink.ResetWorker(w)
	}
}

// dropMalformed skips a batch that does not decode. The workers are not
// reset: a malformed batch may come from a faulty relay or a newer
// producer, and resetting would lose every valid block for it. What the
// batch stored is missing and what it removed stays indexed until the
// engine reports those blocks again (see Stats.Malformed).
func (s *Subscriber) dropMalformed(err error) {
	s.stats.malformed.Add(1)
	s.log.Warn("zmq: skipping malformed batch", "err", err)
}

// apply decodes, converts and applies one batch.
func (s *Subscriber) apply(payload []byte) {
	if err := kvevents.DecodeBatch(payload, &s.batch); err != nil {
		s.dropMalformed(err)
		return
	}
	evs, err := s.conv.Convert(s.evs[:0], &s.batch)
	s.evs = evs
	s.convMu.Lock()
	s.convStats = s.conv.Stats()
	s.convMu.Unlock()
	if err != nil {
		s.dropMalformed(err)
		return
	}
	for i := range evs {
		ev := &evs[i]
		if s.ids[ev.Worker] == 0 {
			// A worker this subscriber has not numbered yet: its numbering
			// starts at 1, so the sink must forget any earlier sequence (an
			// earlier subscriber's, before a restart of this process).
			s.stats.resets.Add(1)
			s.cfg.Sink.ResetWorker(ev.Worker)
		}
		id := s.ids[ev.Worker] + 1
		s.ids[ev.Worker] = id
		ev.ID = id
		if err := s.cfg.Sink.Apply(ev); err != nil {
			s.stats.applyErrs.Add(1)
			if errors.Is(err, indexer.ErrUnknownParent) {
				s.stats.unknownParents.Add(1)
			}
			s.log.Debug("zmq: sink rejected event", "event", ev.String(), "err", err)
			continue
		}
		s.stats.applied.Add(1)
		switch ev.Kind {
		case kvroute.EventStored:
			s.stats.stored.Add(1)
		case kvroute.EventRemoved:
			s.stats.removed.Add(1)
		case kvroute.EventCleared:
			s.stats.cleared.Add(1)
		}
	}
}

// replay asks the replay socket for every batch from seq from on and
// applies those not yet applied, in order. upto, when not zero, is the
// live sequence number that revealed the gap. Batches the buffer no longer
// has are given up (the workers are reset).
func (s *Subscriber) replay(ctx context.Context, from, upto uint64) {
	if s.cfg.ReplayEndpoint == "" {
		return
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dealer := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.ReplayTimeout))
	defer dealer.Close()
	if err := zmqdial.Dial(rctx, dealer, s.cfg.ReplayEndpoint, s.cfg.ReplayTimeout); err != nil {
		s.log.Warn("zmq: replay endpoint unreachable", "err", err)
		return
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], from)
	// The empty delimiter makes the request look like a REQ socket's,
	// the shape every publisher accepts.
	if err := dealer.SendMulti(zmq4.NewMsgFrom([]byte{}, req[:])); err != nil {
		s.log.Warn("zmq: replay request failed", "err", err)
		return
	}
	msgs := make(chan zmq4.Msg, queueLen)
	done := make(chan error, 1)
	go func() { done <- recvLoop(rctx, dealer, msgs) }()
	defer func() {
		cancel()
		dealer.Close()
		<-done
	}()
	timer := time.NewTimer(s.cfg.ReplayTimeout)
	defer timer.Stop()
	r := replayState{from: from, upto: upto, first: true}
	for {
		var m zmq4.Msg
		select {
		case <-ctx.Done():
			return
		case err := <-done:
			done <- err
			s.log.Warn("zmq: replay connection failed", "err", err)
			return
		case <-timer.C:
			s.log.Warn("zmq: replay timed out", "from", from, "next", s.next)
			return
		case m = <-msgs:
			timer.Reset(s.cfg.ReplayTimeout)
		}
		if s.handleReplay(&r, m.Frames) {
			return
		}
	}
}

// replayState is what one replay exchange remembers between replies.
type replayState struct {
	from  uint64 // the first sequence number asked for
	upto  uint64 // the live sequence number that revealed the gap, or 0
	first bool   // no reply has been applied yet
}

// handleReplay processes one reply of the replay exchange r and reports
// whether it was the end marker.
func (s *Subscriber) handleReplay(r *replayState, frames [][]byte) bool {
	seq, payload, ok := replayFrames(frames)
	if !ok {
		s.stats.malformed.Add(1)
		s.log.Warn("zmq: replay reply with unexpected framing", "frames", len(frames))
		return false
	}
	if seq == endSeq {
		return true
	}
	if r.upto != 0 && seq >= r.upto {
		// The live message that revealed the gap and anything after it
		// arrive on the PUB socket too; stop at it so that order holds.
		return false
	}
	if r.first && seq > r.from {
		// The buffer starts after what is missing.
		s.lose(s.next, seq)
	}
	r.first = false
	if seq < s.next {
		return false
	}
	if seq > s.next {
		s.lose(s.next, seq)
	}
	s.apply(payload)
	s.stats.replayed.Add(1)
	s.next = seq + 1
	return false
}

// replayFrames extracts the sequence number and payload of a replay reply:
// [seq, payload], optionally preceded by an empty delimiter and/or a topic
// frame.
func replayFrames(frames [][]byte) (uint64, []byte, bool) {
	if len(frames) > 0 && len(frames[0]) == 0 {
		frames = frames[1:]
	}
	if len(frames) == 3 {
		frames = frames[1:]
	}
	if len(frames) != 2 || len(frames[0]) != 8 {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(frames[0]), frames[1], true
}
