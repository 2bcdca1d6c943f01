package natsx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
)

// Errors returned by the constructors.
var (
	// ErrConfig is wrapped by NewPublisher and NewReplica for an invalid
	// configuration.
	ErrConfig = errors.New("natsx: invalid configuration")
	// ErrRunning is returned by Replica.Run when it is already running.
	ErrRunning = errors.New("natsx: replica already running")
)

// DefaultPrefix is the subject prefix a zero Prefix means.
const DefaultPrefix = "kvroute"

// Subjects under the prefix.
func eventsSubject(prefix string) string { return prefix + ".events" }
func loadSubject(prefix string) string   { return prefix + ".load" }
func dumpSubject(prefix string) string   { return prefix + ".dump" }
func headsSubject(prefix string) string  { return prefix + ".heads" }
func replaySubject(prefix string) string { return prefix + ".replay" }
func haveSubject(prefix string) string   { return prefix + ".have" }
func workerDumpSubject(prefix, replica string) string {
	return prefix + ".wdump." + replica
}
func activeSubject(prefix, replica string) string { return prefix + ".active." + replica }

// Defaults of the Publisher's replay buffer and heads.
const (
	// DefaultReplayEvents is the per-worker replay buffer a zero
	// PublisherConfig.ReplayEvents means.
	DefaultReplayEvents = 8192
	// DefaultReplayIdle is the idle horizon a zero
	// PublisherConfig.ReplayIdle means.
	DefaultReplayIdle = 10 * time.Minute
	// DefaultReplayBytes is the bound a zero PublisherConfig.ReplayBytes
	// means.
	DefaultReplayBytes = 256 << 20
	// DefaultHeadsInterval is the heads period a zero
	// PublisherConfig.HeadsInterval means.
	DefaultHeadsInterval = time.Second
	// replayChunkBytes bounds the event bytes of one replay chunk, well
	// under NATS's default 1 MB payload limit.
	replayChunkBytes = 256 << 10
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Conn is the NATS connection to publish on. Required.
	Conn *nats.Conn
	// Prefix is the subject prefix shared by the publisher and the
	// replicas. Empty means DefaultPrefix.
	Prefix string
	// Hasher hashes the token ids of stored blocks that carry Tokens
	// instead of a Hash. The zero Hasher rejects such events.
	Hasher kvroute.Hasher
	// ReplayEvents is how many of each worker's latest events the
	// Publisher keeps to replay to replicas that lost them (Serve). Zero
	// means DefaultReplayEvents; negative keeps none.
	ReplayEvents int
	// ReplayIdle is how long a worker's replay buffer is kept after its
	// last event: Serve releases the buffers of workers idle for longer
	// (their numbering stays, so their next event continues the
	// sequence). It also is how long a removed worker's replay requests
	// are answered (see RemoveWorker). Replicas ask for lost events
	// within seconds, so a few minutes are plenty. Zero means
	// DefaultReplayIdle; negative keeps the buffers of idle workers, and
	// answers for removed workers for DefaultReplayIdle.
	ReplayIdle time.Duration
	// ReplayBytes bounds the bytes of the messages kept for replay over
	// all workers: past it, the buffers of the workers whose last event
	// is oldest are released first, and the oldest messages of the
	// publishing worker last. Zero means DefaultReplayBytes; negative
	// sets no bound.
	ReplayBytes int
	// HeadsInterval is how often Serve announces each worker's last event
	// ID, so that replicas notice events lost at the end of a burst, and
	// releases idle workers' replay buffers. Zero means
	// DefaultHeadsInterval.
	HeadsInterval time.Duration
	// Logger receives records of failed publishes. Nil discards.
	Logger *slog.Logger
}

// Publisher is a kvevents.Sink that fans events out over NATS to every
// Replica: it sits where an index would, behind a kvevents/zmq Subscriber
// (or any other source), in one relay process per engine or per cluster.
//
// It numbers each worker's events itself, 1, 2, 3, ... for as long as it
// lives, whatever numbering its source uses: each event is one message on
// "<prefix>.events", a Dynamo RouterEvent in named msgpack
// (kvevents.AppendDynamoEvent) with event_id = ID−1. The first message of
// a worker is an unsequenced Cleared event (event_id 2^64−1), the marker
// of a new sequence: replicas reset the worker. ResetWorker later on is a
// sequenced Cleared event, so a replica that misses it sees the gap.
//
// It keeps each worker's last ReplayEvents messages, also those whose
// publish failed (during a NATS reconnect), and Serve answers replicas'
// replay requests from them and announces every worker's last ID. The
// kept messages are bounded in all: a worker's buffer is released when
// the worker is reset (ResetWorker: the messages before the reset) or
// removed (RemoveWorker), when it has been idle for ReplayIdle, and when
// the buffers of all workers pass ReplayBytes. A replay request for
// released messages gets the answer that the relay no longer holds them,
// on which the replica resets the worker (ReplicaStats.Resets) rather than
// keep a stale state; never another worker's or an old sequence's events.
//
// Each worker must have one Publisher at a time: replicas follow the
// Publisher whose heads they hear, and take another's as a relay restart.
// Calls must be serialised per worker, as for any Sink; a Publisher is
// otherwise safe for concurrent use.
type Publisher struct {
	conn    *nats.Conn
	prefix  string
	subject string
	hasher  kvroute.Hasher
	keep    int           // messages kept per worker
	idle    time.Duration // ReplayIdle; 0: never
	forget  time.Duration // how long a removed worker's requests are answered
	bound   int           // ReplayBytes; 0: no bound
	every   time.Duration
	epoch   uint64
	log     *slog.Logger

	mu       sync.Mutex // guards the fields below and the published order
	workers  map[kvroute.WorkerKey]*pubWorker
	kept     int    // bytes of every worker's kept messages
	released uint64 // buffers released
	events   uint64 // events published, which orders the workers' last events
	ticks    uint64 // Serve's heads so far, its clock of the workers' idle time
}

// pubWorker is one worker's numbering and replay buffer.
type pubWorker struct {
	last    uint64   // ID of the last event published
	ring    [][]byte // circular: the n kept messages from ring[head], of IDs last−n+1 .. last
	head, n int      // ring index of the oldest kept message, and their number
	bytes   int      // their total size
	tick    uint64   // Publisher.ticks at the last event, or when the worker was removed
	order   uint64   // Publisher.events at the last event
	removed bool     // RemoveWorker: known only to answer replay requests
	reset   uint64   // ID of the last ResetWorker event; 0: none
}

// PublisherStats is what a Publisher holds.
type PublisherStats struct {
	Workers       int    // workers numbered (removed ones not counted)
	Buffered      int    // workers with messages kept for replay
	BufferedBytes int    // bytes of those messages
	Released      uint64 // buffers released (reset, removed, idle, or ReplayBytes reached); only grows
}

// replayLimit reads a replay bound of PublisherConfig: zero means def, a
// negative value none (0).
func replayLimit(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// NewPublisher returns a Publisher for cfg, or an error wrapping ErrConfig
// when Conn is nil or a duration is negative.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.Conn == nil {
		return nil, fmt.Errorf("%w: no NATS connection", ErrConfig)
	}
	if cfg.HeadsInterval < 0 {
		return nil, fmt.Errorf("%w: heads interval %v", ErrConfig, cfg.HeadsInterval)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	keep := replayLimit(cfg.ReplayEvents, DefaultReplayEvents)
	idle, forget := cfg.ReplayIdle, cfg.ReplayIdle
	switch {
	case idle == 0:
		idle, forget = DefaultReplayIdle, DefaultReplayIdle
	case idle < 0:
		idle, forget = 0, DefaultReplayIdle
	}
	maxBytes := replayLimit(cfg.ReplayBytes, DefaultReplayBytes)
	every := cfg.HeadsInterval
	if every == 0 {
		every = DefaultHeadsInterval
	}
	return &Publisher{conn: cfg.Conn, prefix: cfg.Prefix, subject: eventsSubject(cfg.Prefix), hasher: cfg.Hasher,
		keep: keep, idle: idle, forget: forget, bound: maxBytes, every: every, epoch: uint64(time.Now().UnixNano()), log: log,
		workers: map[kvroute.WorkerKey]*pubWorker{}}, nil
}

// Apply numbers ev in its worker's sequence and publishes it (ev is not
// modified). It returns an error when ev is invalid, carries tokens
// without a configured Hasher, or the connection refuses the message
// (closed, or its buffer is full while reconnecting); a refused message
// stays in the replay buffer, so replicas recover it.
func (p *Publisher) Apply(ev *kvroute.Event) error {
	var d kvevents.DynamoEvent
	if err := d.FromEvent(ev, p.hasher); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.publishLocked(ev.Worker, &d)
}

// ResetWorker tells the replicas to drop what they hold of w: a sequenced
// Cleared event, or the new-sequence marker when w has no events yet.
func (p *Publisher) ResetWorker(w kvroute.WorkerKey) {
	ev := kvroute.Event{Kind: kvroute.EventCleared, Worker: w}
	var d kvevents.DynamoEvent
	if err := d.FromEvent(&ev, p.hasher); err != nil {
		p.log.Warn("natsx: encoding a worker reset failed", "worker", w.String(), "err", err)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.publishLocked(w, &d); err != nil {
		p.log.Warn("natsx: publishing a worker reset failed", "worker", w.String(), "err", err)
	}
	// The events before the reset are of no use to a replica any more:
	// the reset clears the worker. A replay from before it starts at it.
	if pw := p.workers[w]; pw != nil && pw.n > 0 {
		p.dropOldestLocked(pw, pw.n-1)
		pw.reset = pw.last
	}
}

// RemoveWorker forgets w: its replay buffer is released, and its last ID
// no longer announced. Replay requests for it are answered, for
// ReplayIdle, with the answer that the relay no longer holds them, then
// left to other relays. A later event of w starts a new sequence, as for
// a worker never seen (replicas reset it). A relay calls it when an
// engine leaves the pool for good.
func (p *Publisher) RemoveWorker(w kvroute.WorkerKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pw := p.workers[w]
	if pw == nil || pw.removed {
		return
	}
	p.releaseLocked(pw)
	pw.removed, pw.tick = true, p.ticks
}

// Stats returns what the Publisher holds.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PublisherStats{BufferedBytes: p.kept, Released: p.released}
	for _, pw := range p.workers {
		if !pw.removed {
			s.Workers++
		}
		if pw.n > 0 {
			s.Buffered++
		}
	}
	return s
}

// publishLocked numbers d, keeps it for replay and publishes it, after the
// new-sequence marker when w is new. p.mu is held.
func (p *Publisher) publishLocked(w kvroute.WorkerKey, d *kvevents.DynamoEvent) error {
	pw := p.workers[w]
	if pw == nil || pw.removed {
		pw = &pubWorker{tick: p.ticks}
		p.workers[w] = pw
		marker := kvevents.DynamoEvent{}
		ev := kvroute.Event{Kind: kvroute.EventCleared, Worker: w}
		if err := marker.FromEvent(&ev, p.hasher); err != nil {
			return err
		}
		msg, err := kvevents.AppendDynamoEvent(nil, &marker)
		if err != nil {
			return err
		}
		m := &nats.Msg{Subject: p.subject, Data: msg}
		if p.conn.HeadersSupported() {
			m.Header = nats.Header{EpochHeader: []string{strconv.FormatUint(p.epoch, 10)}}
		}
		if err := p.conn.PublishMsg(m); err != nil {
			p.log.Warn("natsx: publishing a new-sequence marker failed", "worker", w.String(), "err", err)
		}
		if d.Kind == kvevents.DynamoCleared {
			return nil // the marker is the reset
		}
	}
	d.EventID = pw.last // ID pw.last+1, as event_id = ID−1
	msg, err := kvevents.AppendDynamoEvent(nil, d)
	if err != nil {
		return err
	}
	pw.last++
	p.events++
	pw.tick, pw.order = p.ticks, p.events
	p.keepLocked(pw, msg)
	if err := p.conn.Publish(p.subject, msg); err != nil {
		return fmt.Errorf("natsx: publish: %w", err)
	}
	return nil
}

// keepLocked stores msg as pw's newest message, then drops its oldest
// beyond ReplayEvents and releases buffers beyond ReplayBytes: first
// those of the workers whose last event is oldest, then pw's oldest
// messages. p.mu is held.
func (p *Publisher) keepLocked(pw *pubWorker, msg []byte) {
	if p.keep == 0 {
		return
	}
	if pw.n == p.keep {
		p.dropOldestLocked(pw, 1)
	}
	if pw.n == len(pw.ring) { // full below ReplayEvents: grow, oldest first
		ring := make([][]byte, min(p.keep, max(16, 2*len(pw.ring))))
		for i := range pw.n {
			ring[i] = pw.ring[(pw.head+i)%len(pw.ring)]
		}
		pw.ring, pw.head = ring, 0
	}
	pw.ring[(pw.head+pw.n)%len(pw.ring)] = msg
	pw.n++
	pw.bytes += len(msg)
	p.kept += len(msg)
	for p.bound > 0 && p.kept > p.bound {
		var lru *pubWorker
		for _, o := range p.workers {
			if o != pw && o.n > 0 && (lru == nil || o.order < lru.order) {
				lru = o
			}
		}
		if lru == nil {
			p.dropOldestLocked(pw, 1)
			continue
		}
		p.releaseLocked(lru)
	}
	if pw.n == 0 { // a message larger than ReplayBytes
		p.releaseLocked(pw)
	}
}

// dropOldestLocked drops pw's n oldest messages. p.mu is held.
func (p *Publisher) dropOldestLocked(pw *pubWorker, n int) {
	for range n {
		m := pw.ring[pw.head]
		pw.bytes -= len(m)
		p.kept -= len(m)
		pw.ring[pw.head] = nil // the ring no longer holds it
		pw.head = (pw.head + 1) % len(pw.ring)
		pw.n--
	}
}

// releaseLocked drops every message pw keeps, and its ring. p.mu is held.
func (p *Publisher) releaseLocked(pw *pubWorker) {
	if pw.ring == nil {
		return
	}
	p.kept -= pw.bytes
	pw.ring, pw.head, pw.n, pw.bytes = nil, 0, 0, 0
	p.released++
}

// messages returns the kept messages of IDs from..to, or false when the
// buffer does not hold all of them. A range from before the worker's last
// reset, when the buffer holds that reset as its oldest message, starts
// at the reset: it clears the worker, so the events before do not matter.
func (pw *pubWorker) messages(from, to uint64) ([][]byte, bool) {
	n := uint64(pw.n)
	if pw.removed || to > pw.last || n == 0 {
		return nil, false
	}
	first := pw.last - n + 1 // ID of ring[head]
	if from < first && pw.reset == first && to >= first {
		from = first
	}
	if from < first {
		return nil, false
	}
	out := make([][]byte, 0, to-from+1)
	for id := from; id <= to; id++ {
		out = append(out, pw.ring[(pw.head+int(id-first))%len(pw.ring)])
	}
	return out, true
}

// sweepLocked counts one more heads period and releases the buffers of
// workers idle for ReplayIdle, and forgets removed workers after it: idle
// time is counted in heads periods, so that publishing an event reads no
// clock. p.mu is held.
func (p *Publisher) sweepLocked() {
	p.ticks++
	for w, pw := range p.workers {
		idle := time.Duration(p.ticks-pw.tick) * p.every
		switch {
		case pw.removed && idle > p.forget:
			delete(p.workers, w)
		case p.idle > 0 && idle > p.idle && pw.ring != nil:
			p.releaseLocked(pw)
		}
	}
}

// Serve answers replicas' replay requests from the replay buffer and
// announces each worker's last event ID every HeadsInterval (when it also
// releases the buffers of idle workers), until ctx ends; then it returns
// nil. It returns an error when subscribing fails.
// A relay runs it on a goroutine of its own next to its event source.
func (p *Publisher) Serve(ctx context.Context) error {
	sub, err := p.conn.Subscribe(replaySubject(p.prefix), p.serveReplay)
	if err != nil {
		return fmt.Errorf("natsx: subscribe replay: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	t := time.NewTicker(p.every)
	defer t.Stop()
	var buf []byte
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		h := heads{epoch: p.epoch}
		p.mu.Lock()
		p.sweepLocked()
		for w, pw := range p.workers {
			if !pw.removed {
				h.last = append(h.last, workerID{worker: w, id: pw.last})
			}
		}
		p.mu.Unlock()
		buf = appendHeads(buf[:0], &h)
		if err := publishWire(p.conn, headsSubject(p.prefix), "", buf); err != nil {
			p.log.Debug("natsx: publishing heads failed", "err", err)
		}
	}
}

// serveReplay answers one replay request: the kept messages in chunks, or
// a final chunk with ok false. Requests for workers this Publisher does not
// know are left to other relays.
func (p *Publisher) serveReplay(m *nats.Msg) {
	err := checkWire(m.Header)
	if errors.Is(err, errWireVersion) {
		p.log.Warn("natsx: replay request of a newer wire version not answered; upgrade this relay", "err", err)
		return
	}
	var req replayReq
	if err == nil {
		req, err = decodeReplayReq(m.Data)
	}
	if err != nil || m.Reply == "" {
		p.log.Debug("natsx: bad replay request", "err", err)
		return
	}
	p.mu.Lock()
	pw := p.workers[req.worker]
	var msgs [][]byte
	ok := false
	if pw != nil {
		msgs, ok = pw.messages(req.from, req.to)
	}
	p.mu.Unlock()
	if pw == nil {
		return
	}
	c := replayChunk{ok: ok}
	size := 0
	var buf []byte
	for i, msg := range msgs {
		c.msgs = append(c.msgs, msg)
		size += len(msg)
		if size < replayChunkBytes || i == len(msgs)-1 {
			continue
		}
		buf = appendReplayChunk(buf[:0], &c)
		if err := publishWire(p.conn, m.Reply, "", buf); err != nil {
			p.log.Debug("natsx: replay answer failed", "err", err)
			return
		}
		c = replayChunk{index: c.index + 1, ok: ok}
		size = 0
	}
	c.final = true
	buf = appendReplayChunk(buf[:0], &c)
	if err := publishWire(p.conn, m.Reply, "", buf); err != nil {
		p.log.Debug("natsx: replay answer failed", "err", err)
	}
}
