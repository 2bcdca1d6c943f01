package natsx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/scheduling"
)

// Tunables of the load sync and the dump exchange.
const (
	// MaxLoadBatch is the most load operations sent in one message.
	MaxLoadBatch = 256
	// LoadFlushInterval is the longest a load operation waits to be sent.
	LoadFlushInterval = time.Millisecond
	// DefaultSyncTimeout is the wait for a peer's dump a zero
	// ReplicaConfig.SyncTimeout means.
	DefaultSyncTimeout = 2 * time.Second
	// dumpChunkItems bounds the events and operations of one dump chunk,
	// keeping chunks well under NATS's default 1 MB payload limit.
	dumpChunkItems = 256
	// queueLen is the buffer of received messages; when it overflows NATS
	// drops messages for this replica, which the event sequence reveals.
	queueLen = 1 << 16
)

// Index is what a Replica needs of the index it maintains;
// *indexer.Index implements it.
type Index interface {
	Apply(ev *kvroute.Event) error
	ResetWorker(w kvroute.WorkerKey)
	LastEventID(w kvroute.WorkerKey) (uint64, bool)
	Workers() []kvroute.WorkerKey
	Dump(fn func(*kvroute.Event) error) error
}

// ReplicaConfig configures a Replica.
type ReplicaConfig struct {
	// Conn is the NATS connection. Required.
	Conn *nats.Conn
	// Prefix is the subject prefix shared with the Publisher and the other
	// replicas. Empty means DefaultPrefix.
	Prefix string
	// ID names this router replica; it must differ between replicas.
	// Required.
	ID string
	// Index is the local index the replica keeps in step with the event
	// stream. Required.
	Index Index
	// Tracker is the local active-request load tracker. Nil disables the
	// load sync (Add, PrefillDone and Free then return errors / false).
	Tracker *scheduling.Tracker
	// SyncTimeout is how long Run waits for a peer's dump (or, once the
	// dump started, for its next chunk) before it
	// concludes that it is the first replica. Zero means
	// DefaultSyncTimeout.
	SyncTimeout time.Duration
	// Logger receives records of gaps, resyncs and malformed messages.
	// Nil discards.
	Logger *slog.Logger
}

// ReplicaStats counts what a Replica did. All fields only grow.
type ReplicaStats struct {
	Events      uint64 // event messages received
	Applied     uint64 // events applied to the index without error
	ApplyErrs   uint64 // events the index rejected (other than gaps)
	Gaps        uint64 // sequence gaps that forced a resync
	Syncs       uint64 // dumps received and applied (or first-replica starts)
	DumpsServed uint64 // dumps sent to other replicas
	LoadOps     uint64 // load operations received from peers and applied
	Malformed   uint64 // messages that did not decode
}

// activeReq is a request the load sync knows, kept to hand to a
// restarting peer.
type activeReq struct {
	origin string
	op     loadOp
}

// Replica keeps one router replica's index and load in step with every
// other replica's over NATS:
//
//   - it applies the events a Publisher sends on "<prefix>.events" to its
//     Index, checking each worker's sequence;
//   - it shares the active-request load: Add, PrefillDone and Free update
//     the local Tracker at once and are broadcast on "<prefix>.load" in
//     batches of up to MaxLoadBatch operations or LoadFlushInterval, tagged
//     with the replica's ID; each replica applies the others' operations
//     (and ignores its own echo) under the request id LocalID(origin, id),
//     so all trackers hold the same requests under the same ids;
//   - it starts (and recovers from a gap) by asking a peer for a dump of
//     its state on "<prefix>.dump": the peer streams its index (as
//     unsequenced events), each worker's last event ID and its active
//     requests; events that arrive meanwhile are held back and applied
//     after the dump, skipping those the dump already covers;
//   - once in sync it serves dumps to other replicas (one replica of the
//     queue group answers each request).
//
// Run drives all of this on one goroutine; the load methods may be called
// from any goroutine, before or while Run runs.
type Replica struct {
	cfg     ReplicaConfig
	log     *slog.Logger
	running atomic.Bool
	ready   chan struct{}
	once    sync.Once

	mu      sync.Mutex // guards pending and active
	pending []loadOp   // local operations not yet published
	active  map[scheduling.RequestID]activeReq
	kick    chan struct{}

	stats struct {
		events, applied, applyErrs, gaps, syncs, dumps, loadOps, malformed atomic.Uint64
	}
}

// NewReplica returns a Replica for cfg, or an error wrapping ErrConfig
// when Conn, ID or Index is missing. It does not subscribe until Run.
func NewReplica(cfg ReplicaConfig) (*Replica, error) {
	switch {
	case cfg.Conn == nil:
		return nil, fmt.Errorf("%w: no NATS connection", ErrConfig)
	case cfg.ID == "":
		return nil, fmt.Errorf("%w: no replica id", ErrConfig)
	case cfg.Index == nil:
		return nil, fmt.Errorf("%w: no index", ErrConfig)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.SyncTimeout <= 0 {
		cfg.SyncTimeout = DefaultSyncTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Replica{
		cfg:    cfg,
		log:    log.With("replica", cfg.ID),
		ready:  make(chan struct{}),
		active: make(map[scheduling.RequestID]activeReq),
		kick:   make(chan struct{}, 1),
	}, nil
}

// Ready is closed once the replica has completed its first sync (a peer's
// dump applied, or no peer answered within SyncTimeout).
func (r *Replica) Ready() <-chan struct{} { return r.ready }

// Stats returns the replica's counters.
func (r *Replica) Stats() ReplicaStats {
	return ReplicaStats{
		Events: r.stats.events.Load(), Applied: r.stats.applied.Load(), ApplyErrs: r.stats.applyErrs.Load(),
		Gaps: r.stats.gaps.Load(), Syncs: r.stats.syncs.Load(), DumpsServed: r.stats.dumps.Load(),
		LoadOps: r.stats.loadOps.Load(), Malformed: r.stats.malformed.Load(),
	}
}

// ErrNoTracker is returned by Add when the replica has no Tracker.
var ErrNoTracker = errors.New("natsx: replica has no tracker")

// Add records a request this router sent to worker w (see
// scheduling.Tracker.Add) under LocalID(ID, id) and shares it with the
// other replicas. blocks is copied. It returns the Tracker's error, or
// ErrNoTracker.
func (r *Replica) Add(id scheduling.RequestID, w kvroute.WorkerKey, blocks []kvroute.SeqHash, prefillTokens int) error {
	if r.cfg.Tracker == nil {
		return ErrNoTracker
	}
	lid := LocalID(r.cfg.ID, id)
	if err := r.cfg.Tracker.Add(lid, w, blocks, prefillTokens); err != nil {
		return err
	}
	op := loadOp{op: opAdd, id: id, worker: w, prefillTokens: prefillTokens, blocks: append([]kvroute.SeqHash(nil), blocks...)}
	r.mu.Lock()
	r.active[lid] = activeReq{origin: r.cfg.ID, op: op}
	r.mu.Unlock()
	r.enqueue(op)
	return nil
}

// PrefillDone records that request id of this router finished prefill
// and shares it. It reports whether the request was tracked.
func (r *Replica) PrefillDone(id scheduling.RequestID) bool {
	if r.cfg.Tracker == nil {
		return false
	}
	lid := LocalID(r.cfg.ID, id)
	if !r.cfg.Tracker.PrefillDone(lid) {
		return false
	}
	r.mu.Lock()
	if a, ok := r.active[lid]; ok {
		a.op.prefillDone = true
		r.active[lid] = a
	}
	r.mu.Unlock()
	r.enqueue(loadOp{op: opPrefillDone, id: id})
	return true
}

// Free records that request id of this router ended and shares it. It
// reports whether the request was tracked.
func (r *Replica) Free(id scheduling.RequestID) bool {
	if r.cfg.Tracker == nil {
		return false
	}
	lid := LocalID(r.cfg.ID, id)
	freed := r.cfg.Tracker.Free(lid)
	r.mu.Lock()
	delete(r.active, lid)
	r.mu.Unlock()
	if freed {
		r.enqueue(loadOp{op: opFree, id: id})
	}
	return freed
}

func (r *Replica) enqueue(op loadOp) {
	r.mu.Lock()
	r.pending = append(r.pending, op)
	n := len(r.pending)
	r.mu.Unlock()
	if n == 1 || n >= MaxLoadBatch {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

// syncState is Run's state while it waits for a dump.
type syncState struct {
	inbox    string
	next     uint64 // next chunk index
	chunks   []*dumpChunk
	held     []*nats.Msg // events and load batches received meanwhile
	deadline *time.Timer
	reset    bool // drop the current state first (a resync, not the start)
}

// Run subscribes, syncs from a peer and keeps the index and load in step
// until ctx ends; then it unsubscribes, publishes pending load operations
// and returns nil. It returns ErrRunning if already running, or an error
// when subscribing fails.
func (r *Replica) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	conn := r.cfg.Conn
	ch := make(chan *nats.Msg, queueLen)
	inboxBase := conn.NewRespInbox()
	var subs []*nats.Subscription
	var serving *nats.Subscription // the dump service, while in sync
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
		if serving != nil {
			_ = serving.Unsubscribe()
		}
	}()
	for _, subj := range []string{eventsSubject(r.cfg.Prefix), loadSubject(r.cfg.Prefix), inboxBase + ".*"} {
		s, err := conn.ChanSubscribe(subj, ch)
		if err != nil {
			return fmt.Errorf("natsx: subscribe %s: %w", subj, err)
		}
		subs = append(subs, s)
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("natsx: flush: %w", err)
	}
	floors := make(map[kvroute.WorkerKey]uint64)
	var attempt int
	startSync := func(reset bool) *syncState {
		if serving != nil {
			// A replica that is syncing does not answer dump requests.
			_ = serving.Unsubscribe()
			serving = nil
		}
		attempt++
		st := &syncState{inbox: inboxBase + "." + strconv.Itoa(attempt), reset: reset,
			deadline: time.NewTimer(r.cfg.SyncTimeout)}
		if err := conn.PublishRequest(dumpSubject(r.cfg.Prefix), st.inbox, []byte(r.cfg.ID)); err != nil {
			r.log.Warn("natsx: dump request failed", "err", err)
		}
		return st
	}
	sync := startSync(false)
	flushTimer := time.NewTimer(time.Hour)
	flushTimer.Stop()
	defer flushTimer.Stop()
	armed := false
	var ops []loadOp
	var ev kvroute.Event
	var dyn kvevents.DynamoEvent

	applyEvent := func(data []byte) (gap bool) {
		r.stats.events.Add(1)
		if _, err := kvevents.DecodeDynamoEvent(data, &dyn); err != nil {
			r.stats.malformed.Add(1)
			return false
		}
		if err := dyn.ToEvent(&ev); err != nil {
			r.stats.malformed.Add(1)
			return false
		}
		if ev.Kind == kvroute.EventCleared && ev.ID == 0 {
			// A relay's worker reset (Publisher.ResetWorker): its events
			// start a new sequence, whatever was applied before.
			r.cfg.Index.ResetWorker(ev.Worker)
			delete(floors, ev.Worker)
			r.stats.applied.Add(1)
			return false
		}
		if f, ok := floors[ev.Worker]; ok && ev.ID != 0 {
			if ev.ID <= f {
				return false // the dump covered it
			}
			delete(floors, ev.Worker)
			if ev.ID != f+1 {
				r.log.Info("natsx: gap after dump", "worker", ev.Worker.String(), "want", f+1, "got", ev.ID)
				return true
			}
		}
		err := r.cfg.Index.Apply(&ev)
		switch {
		case err == nil:
			r.stats.applied.Add(1)
		case errors.Is(err, indexer.ErrGap):
			r.log.Info("natsx: event gap", "err", err)
			return true
		default:
			r.stats.applyErrs.Add(1)
		}
		return false
	}
	applyLoad := func(data []byte) {
		origin, got, err := decodeLoadBatch(data, ops[:0])
		ops = got
		if err != nil {
			r.stats.malformed.Add(1)
			return
		}
		if origin == r.cfg.ID {
			return // our own echo
		}
		for i := range ops {
			r.applyPeerOp(origin, &ops[i])
		}
	}
	finishSync := func(st *syncState) {
		st.deadline.Stop()
		if st.reset {
			for _, w := range r.cfg.Index.Workers() {
				r.cfg.Index.ResetWorker(w)
			}
		}
		clear(floors)
		for _, c := range st.chunks {
			for _, l := range c.last {
				floors[l.worker] = l.id
			}
			for i := range c.events {
				if err := c.events[i].ToEvent(&ev); err != nil {
					r.stats.malformed.Add(1)
					continue
				}
				if err := r.cfg.Index.Apply(&ev); err != nil {
					r.stats.applyErrs.Add(1)
				}
			}
			for i := range c.ops {
				r.applyPeerOp(c.ops[i].origin, &c.ops[i].op)
			}
		}
		r.stats.syncs.Add(1)
		r.once.Do(func() { close(r.ready) })
		r.log.Debug("natsx: synced", "chunks", len(st.chunks), "held", len(st.held))
	}

	var err error
	for {
		if sync == nil && serving == nil {
			if serving, err = conn.ChanQueueSubscribe(dumpSubject(r.cfg.Prefix), "dump", ch); err != nil {
				return fmt.Errorf("natsx: subscribe dump: %w", err)
			}
		}
		var deadline <-chan time.Time
		if sync != nil {
			deadline = sync.deadline.C
		}
		select {
		case <-ctx.Done():
			r.flushLoad()
			return nil
		case <-r.kick:
			r.mu.Lock()
			n := len(r.pending)
			r.mu.Unlock()
			if n >= MaxLoadBatch {
				r.flushLoad()
			} else if n > 0 && !armed {
				flushTimer.Reset(LoadFlushInterval)
				armed = true
			}
		case <-flushTimer.C:
			armed = false
			r.flushLoad()
		case <-deadline:
			if len(sync.chunks) > 0 {
				r.log.Warn("natsx: dump incomplete, asking again")
				held := sync.held
				sync = startSync(sync.reset)
				sync.held = held
				continue
			}
			// Nobody answered: we are the first replica.
			st := sync
			sync = nil
			finishSync(st)
			if rest, gap := r.replayHeld(st.held, applyEvent, applyLoad); gap {
				sync = startSync(true)
				sync.held = rest
			}
		case m := <-ch:
			switch {
			case m.Sub == serving:
				if sync == nil && string(m.Data) != r.cfg.ID && m.Reply != "" {
					r.serveDump(m.Reply)
				}
			case m.Sub == subs[0] || m.Sub == subs[1]:
				if sync != nil {
					sync.held = append(sync.held, m)
					continue
				}
				if m.Sub == subs[1] {
					applyLoad(m.Data)
					continue
				}
				if applyEvent(m.Data) {
					r.stats.gaps.Add(1)
					sync = startSync(true)
				}
			default: // a dump chunk
				if sync == nil || m.Subject != sync.inbox {
					continue // a late reply to an earlier attempt
				}
				if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
					// No responders: no other replica is in sync yet, so
					// this one starts from what it has.
					st := sync
					sync = nil
					finishSync(st)
					if rest, gap := r.replayHeld(st.held, applyEvent, applyLoad); gap {
						sync = startSync(true)
						sync.held = rest
					}
					continue
				}
				c, err := decodeDumpChunk(m.Data)
				if err != nil || c.index != sync.next {
					r.stats.malformed.Add(1)
					r.log.Warn("natsx: bad dump chunk, asking again", "err", err)
					held := sync.held
					sync = startSync(sync.reset)
					sync.held = held
					continue
				}
				sync.next++
				sync.chunks = append(sync.chunks, c)
				// SyncTimeout bounds the silence between chunks, not the
				// whole dump, which may be long for a large index.
				if !sync.deadline.Stop() {
					select {
					case <-sync.deadline.C:
					default:
					}
				}
				sync.deadline.Reset(r.cfg.SyncTimeout)
				if c.final {
					st := sync
					sync = nil
					finishSync(st)
					if rest, gap := r.replayHeld(st.held, applyEvent, applyLoad); gap {
						sync = startSync(true)
						sync.held = rest
					}
				}
			}
		}
	}
}

// replayHeld applies what arrived during a sync, in order. On a gap it
// returns the messages after it, to be held by the resync it must start.
func (r *Replica) replayHeld(held []*nats.Msg, applyEvent func([]byte) bool, applyLoad func([]byte)) (rest []*nats.Msg, gap bool) {
	for i, m := range held {
		if m.Subject == loadSubject(r.cfg.Prefix) {
			applyLoad(m.Data)
			continue
		}
		if applyEvent(m.Data) {
			r.stats.gaps.Add(1)
			return held[i+1:], true
		}
	}
	return nil, false
}

// applyPeerOp applies another router's load operation to the local
// tracker.
func (r *Replica) applyPeerOp(origin string, op *loadOp) {
	if r.cfg.Tracker == nil {
		return
	}
	lid := LocalID(origin, op.id)
	r.stats.loadOps.Add(1)
	switch op.op {
	case opAdd:
		if err := r.cfg.Tracker.Add(lid, op.worker, op.blocks, op.prefillTokens); err != nil {
			return // already known (a dump and a live add of one request)
		}
		if op.prefillDone {
			r.cfg.Tracker.PrefillDone(lid)
		}
		r.mu.Lock()
		r.active[lid] = activeReq{origin: origin, op: *op}
		r.mu.Unlock()
	case opPrefillDone:
		r.cfg.Tracker.PrefillDone(lid)
		r.mu.Lock()
		if a, ok := r.active[lid]; ok {
			a.op.prefillDone = true
			r.active[lid] = a
		}
		r.mu.Unlock()
	case opFree:
		r.cfg.Tracker.Free(lid)
		r.mu.Lock()
		delete(r.active, lid)
		r.mu.Unlock()
	}
}

// flushLoad publishes the pending local load operations.
func (r *Replica) flushLoad() {
	r.mu.Lock()
	ops := r.pending
	r.pending = nil
	r.mu.Unlock()
	for len(ops) > 0 {
		n := min(len(ops), MaxLoadBatch)
		msg := appendLoadBatch(nil, r.cfg.ID, ops[:n])
		if err := r.cfg.Conn.Publish(loadSubject(r.cfg.Prefix), msg); err != nil {
			r.log.Warn("natsx: publishing load failed", "err", err)
		}
		ops = ops[n:]
	}
}

// serveDump streams the index, the last event IDs and the active requests
// to reply, in chunks.
func (r *Replica) serveDump(reply string) {
	c := &dumpChunk{}
	for _, w := range r.cfg.Index.Workers() {
		if id, ok := r.cfg.Index.LastEventID(w); ok {
			c.last = append(c.last, lastID{w, id})
		}
	}
	var buf []byte
	send := func(final bool) error {
		c.final = final
		var err error
		if buf, err = appendDumpChunk(buf[:0], c); err != nil {
			return err
		}
		if err := r.cfg.Conn.Publish(reply, buf); err != nil {
			return err
		}
		c = &dumpChunk{index: c.index + 1}
		return nil
	}
	err := r.cfg.Index.Dump(func(ev *kvroute.Event) error {
		var d kvevents.DynamoEvent
		if err := d.FromEvent(ev, kvroute.Hasher{}); err != nil {
			return err
		}
		c.events = append(c.events, d)
		if len(c.events) >= dumpChunkItems {
			return send(false)
		}
		return nil
	})
	if err == nil {
		r.mu.Lock()
		for _, a := range r.active {
			c.ops = append(c.ops, originOp{origin: a.origin, op: a.op})
			if len(c.ops) >= dumpChunkItems {
				if err = send(false); err != nil {
					break
				}
			}
		}
		r.mu.Unlock()
	}
	if err == nil {
		err = send(true)
	}
	if err != nil {
		r.log.Warn("natsx: serving a dump failed", "err", err)
		return
	}
	r.stats.dumps.Add(1)
}
