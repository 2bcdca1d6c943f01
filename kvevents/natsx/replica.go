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
	// DefaultLoadHeartbeat is the heartbeat period a zero
	// ReplicaConfig.LoadHeartbeat means.
	DefaultLoadHeartbeat = time.Second
	// DefaultMaxPeerRequests is the bound a zero
	// ReplicaConfig.MaxPeerRequests means.
	DefaultMaxPeerRequests = 1 << 18
	// dumpChunkItems bounds the events and requests of one chunk; the
	// payload budget bounds their bytes.
	dumpChunkItems = 256
	// dumpRemovedPerEvent bounds the block hashes of a Removed event in a
	// dump (about 150 KB), so that each fits a chunk.
	dumpRemovedPerEvent = 1 << 14
	// defaultMaxPayload is NATS's default payload limit, assumed while the
	// connection has not told the server's.
	defaultMaxPayload = 1 << 20
	// loadOpFixedBytes bounds the encoding of a load operation without its
	// blocks (array header, op, id, worker, rank, prefill, done, output,
	// blocks header); each block takes at most blockBytes more.
	loadOpFixedBytes = 1 + 2 + 9 + 9 + 5 + 9 + 1 + 9 + 5
	blockBytes       = 9
	// activeReqFixedBytes bounds what an active request adds to its load
	// operation (array header and time left).
	activeReqFixedBytes = 1 + 9
	// msgFixedBytes bounds the fields of a load batch or active chunk
	// besides its origin and operations.
	msgFixedBytes = 64
	// queueLen is the buffer of received messages; when it overflows NATS
	// drops messages for this replica, which the event sequence reveals.
	queueLen = 1 << 16
)

// Index is what a Replica needs of the index it maintains;
// *indexer.Index implements it.
type Index interface {
	Apply(ev *kvroute.Event) error
	ResetWorker(w kvroute.WorkerKey)
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
	// ID names this router replica; it must differ between replicas and
	// be a valid NATS subject token (no spaces, dots or wildcards).
	// Required.
	ID string
	// Index is the local index the replica keeps in step with the event
	// stream. Required.
	Index Index
	// Tracker is the local load tracker: the replica adds the other
	// replicas' requests to it. With router.Router, create the tracker
	// first and pass it as router.Config.LoadTracker, with the Replica as
	// router.Config.LoadSync. A host that tracks its requests itself
	// calls the Tracker for its own and reports them to the Replica's
	// LoadSync methods. Nil disables the load sync.
	Tracker *scheduling.Tracker
	// TTL is how long a request lives without an update, the same on every
	// replica. Zero means Tracker.TTL(); set the routers' tracker TTL (and
	// this) alike on every replica.
	TTL time.Duration
	// LoadHeartbeat is how often the replica tells its peers it is alive
	// (and how far its load operations go). Zero means
	// DefaultLoadHeartbeat.
	LoadHeartbeat time.Duration
	// PeerTimeout is how long after a peer's last message its requests are
	// dropped. Zero means five LoadHeartbeats.
	PeerTimeout time.Duration
	// MaxPeerRequests bounds the requests kept per peer (and of this
	// replica's own, to share). Zero means DefaultMaxPeerRequests.
	MaxPeerRequests int
	// OnPeerLoad, when set, is called after peers' requests finished their
	// prefill or ended, from Run's goroutine: pass the router's
	// LoadChanged so that queued requests look again.
	OnPeerLoad func()
	// SyncTimeout is how long Run waits for a peer's dump (or, once the
	// dump started, for its next chunk) before it concludes that it is the
	// first replica, and bounds each step of a worker's repair. Zero means
	// DefaultSyncTimeout.
	SyncTimeout time.Duration
	// Logger receives records of gaps, repairs and malformed messages.
	// Nil discards.
	Logger *slog.Logger
}

// ReplicaStats counts what a Replica did. All fields only grow.
type ReplicaStats struct {
	Events      uint64 // event messages received
	Applied     uint64 // events applied to the index without error
	ApplyErrs   uint64 // events the index rejected
	Gaps        uint64 // workers' sequence gaps seen (in the stream or in the relay's heads)
	ByDump      uint64 // gaps repaired from a peer's dump of the worker
	ByReplay    uint64 // gaps repaired from the relay's replay
	Resets      uint64 // gaps neither could repair: the worker was reset
	Syncs       uint64 // start-up dumps applied (or first-replica starts)
	DumpsServed uint64 // dumps sent to other replicas (whole or one worker)
	LoadOps     uint64 // load operations received from peers and applied
	PeerResyncs uint64 // peers' active requests fetched after lost load messages
	PeerDrops   uint64 // peers whose requests were dropped (silent, or restarted)
	Overflow    uint64 // requests not shared or not kept: MaxPeerRequests reached
	Malformed   uint64 // messages that did not decode
	NewerWire   uint64 // messages of a newer major wire version than WireVersion, dropped unread
}

// ownReq is a request of this replica's router, kept to hand to peers.
type ownReq struct {
	op       loadOp
	deadline time.Time
}

// Replica keeps one router replica's index and load in step with every
// other replica's over NATS.
//
// Index: it applies the events a Publisher sends on "<prefix>.events" to
// its Index, checking each worker's sequence. A gap repairs that worker
// only, while the others go on: from a peer's dump of the worker when a
// peer is in sync with it, otherwise from the relay's replay buffer
// (Publisher.Serve), and only when neither can, by resetting the worker
// (counted in ReplicaStats.Resets). The event that revealed the gap, and
// the worker's events that arrive meanwhile, are kept and applied after
// the repair. The relay's periodic heads reveal events lost at the end of
// a burst. At start the replica loads a whole dump from one peer.
//
// Load: the Replica is a router.LoadSync. The router adds its own requests
// to its tracker and reports them here; the replica sends them to its
// peers on "<prefix>.load" and adds the peers' requests to the same
// tracker under LocalID(origin, id), so each router's Select counts every
// request of every replica exactly once. Requests live TTL after their
// last update on every replica (a joining replica gets the time each one
// has left); a peer that stays silent for PeerTimeout, or restarts, has
// its requests dropped; lost load messages are noticed by their sequence
// numbers and repaired by fetching the peer's active requests.
//
// Run drives all of this on one goroutine; the LoadSync methods may be
// called from any goroutine, before or while Run runs.
type Replica struct {
	cfg         ReplicaConfig
	log         *slog.Logger
	replies     *replies // answers to requests, while Run runs
	ttl         time.Duration
	incarnation uint64
	running     atomic.Bool
	ready       chan struct{}
	once        sync.Once

	mu      sync.Mutex // guards pending, own and seq
	pending []loadOp   // own operations not yet published
	own     map[scheduling.RequestID]*ownReq
	seq     uint64 // last load batch numbered
	kick    chan struct{}

	stats struct {
		events, applied, applyErrs, gaps, byDump, byReplay, resets, syncs, dumps atomic.Uint64
		loadOps, resyncs, drops, overflow, malformed, newerWire                  atomic.Uint64
	}
}

// NewReplica returns a Replica for cfg, or an error wrapping ErrConfig
// when Conn, ID or Index is missing or a duration is negative. It does not
// subscribe until Run.
func NewReplica(cfg ReplicaConfig) (*Replica, error) {
	switch {
	case cfg.Conn == nil:
		return nil, fmt.Errorf("%w: no NATS connection", ErrConfig)
	case cfg.ID == "":
		return nil, fmt.Errorf("%w: no replica id", ErrConfig)
	case cfg.Index == nil:
		return nil, fmt.Errorf("%w: no index", ErrConfig)
	case cfg.TTL < 0 || cfg.LoadHeartbeat < 0 || cfg.PeerTimeout < 0 || cfg.SyncTimeout < 0 || cfg.MaxPeerRequests < 0:
		return nil, fmt.Errorf("%w: negative duration or bound", ErrConfig)
	}
	for _, c := range cfg.ID {
		if c <= ' ' || c == '.' || c == '*' || c == '>' {
			return nil, fmt.Errorf("%w: replica id %q is not a subject token", ErrConfig, cfg.ID)
		}
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.SyncTimeout == 0 {
		cfg.SyncTimeout = DefaultSyncTimeout
	}
	if cfg.LoadHeartbeat == 0 {
		cfg.LoadHeartbeat = DefaultLoadHeartbeat
	}
	if cfg.PeerTimeout == 0 {
		cfg.PeerTimeout = 5 * cfg.LoadHeartbeat
	}
	if cfg.MaxPeerRequests == 0 {
		cfg.MaxPeerRequests = DefaultMaxPeerRequests
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ttl := cfg.TTL
	if ttl == 0 {
		ttl = scheduling.DefaultRequestTTL
		if cfg.Tracker != nil {
			ttl = cfg.Tracker.TTL()
		}
	}
	return &Replica{
		cfg:         cfg,
		log:         log.With("replica", cfg.ID),
		ttl:         ttl,
		incarnation: uint64(time.Now().UnixNano()),
		ready:       make(chan struct{}),
		own:         make(map[scheduling.RequestID]*ownReq),
		kick:        make(chan struct{}, 1),
	}, nil
}

// Ready is closed once the replica has completed its first sync (a peer's
// dump applied, or no peer answered within SyncTimeout).
func (r *Replica) Ready() <-chan struct{} { return r.ready }

// Stats returns the replica's counters.
func (r *Replica) Stats() ReplicaStats {
	return ReplicaStats{
		Events: r.stats.events.Load(), Applied: r.stats.applied.Load(), ApplyErrs: r.stats.applyErrs.Load(),
		Gaps: r.stats.gaps.Load(), ByDump: r.stats.byDump.Load(), ByReplay: r.stats.byReplay.Load(),
		Resets: r.stats.resets.Load(), Syncs: r.stats.syncs.Load(), DumpsServed: r.stats.dumps.Load(),
		LoadOps: r.stats.loadOps.Load(), PeerResyncs: r.stats.resyncs.Load(), PeerDrops: r.stats.drops.Load(),
		Overflow: r.stats.overflow.Load(), Malformed: r.stats.malformed.Load(), NewerWire: r.stats.newerWire.Load(),
	}
}

// Added implements router.LoadSync: request id of this replica's router
// went to worker w. blocks is copied.
func (r *Replica) Added(id scheduling.RequestID, w kvroute.WorkerKey, blocks []kvroute.SeqHash, prefillTokens int) {
	if r.cfg.Tracker == nil {
		return
	}
	op := loadOp{op: opAdd, id: id, worker: w, prefillTokens: prefillTokens, blocks: append([]kvroute.SeqHash(nil), blocks...)}
	r.mu.Lock()
	if len(r.own) >= r.cfg.MaxPeerRequests {
		r.mu.Unlock()
		r.stats.overflow.Add(1)
		return
	}
	r.own[id] = &ownReq{op: op, deadline: time.Now().Add(r.ttl)}
	r.enqueueLocked(op)
}

// PrefillDone implements router.LoadSync.
func (r *Replica) PrefillDone(id scheduling.RequestID) {
	r.update(id, loadOp{op: opPrefillDone, id: id}, func(o *ownReq) { o.op.prefillDone = true })
}

// OutputTokens implements router.LoadSync.
func (r *Replica) OutputTokens(id scheduling.RequestID, n int) {
	if n > 0 {
		r.update(id, loadOp{op: opOutput, id: id, output: n}, func(o *ownReq) { o.op.output += n })
	}
}

// Freed implements router.LoadSync.
func (r *Replica) Freed(id scheduling.RequestID) {
	r.mu.Lock()
	if _, ok := r.own[id]; !ok {
		r.mu.Unlock()
		return
	}
	delete(r.own, id)
	r.enqueueLocked(loadOp{op: opFree, id: id})
}

// update applies f to own request id and shares op, when the request is
// known.
func (r *Replica) update(id scheduling.RequestID, op loadOp, f func(*ownReq)) {
	r.mu.Lock()
	o := r.own[id]
	if o == nil {
		r.mu.Unlock()
		return
	}
	f(o)
	o.deadline = time.Now().Add(r.ttl)
	r.enqueueLocked(op)
}

// enqueueLocked queues op for publishing and unlocks r.mu.
func (r *Replica) enqueueLocked(op loadOp) {
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

// loadOpBytes bounds the encoded size of o.
func loadOpBytes(o *loadOp) int { return loadOpFixedBytes + blockBytes*len(o.blocks) }

// payloadBudget is the encoded size at which a load batch, an active
// chunk or a dump chunk is closed: half the server's payload limit, which
// leaves room for the message's headers and the subject.
func (r *Replica) payloadBudget() int {
	if m := r.cfg.Conn.MaxPayload(); m > 0 {
		return int(m / 2)
	}
	return defaultMaxPayload / 2
}

// chunkSize decides where the messages of a list of items close: before
// an item that would take a message past maxItems items or budget bytes
// (an item larger than budget goes alone).
type chunkSize struct {
	budget, maxItems int
	items, size      int // the open message's items and bytes
}

// newChunkSize returns the chunkSize of an empty first message, whose
// bytes before its items are header.
func newChunkSize(budget, maxItems, header int) chunkSize {
	return chunkSize{budget: budget, maxItems: maxItems, size: header}
}

// full reports whether the message must close before an item of n bytes.
func (c *chunkSize) full(n int) bool {
	return c.items > 0 && (c.items >= c.maxItems || c.size+n > c.budget)
}

// add counts an item of n bytes in the message.
func (c *chunkSize) add(n int) { c.items, c.size = c.items+1, c.size+n }

// next starts the next message, whose header is header bytes.
func (c *chunkSize) next(header int) { c.items, c.size = 0, header }

// takeBatchesLocked numbers and encodes the pending operations, at most
// MaxLoadBatch and about payloadBudget bytes per batch (a single
// operation larger than that goes alone). r.mu is held.
func (r *Replica) takeBatchesLocked() [][]byte {
	var out [][]byte
	header := msgFixedBytes + len(r.cfg.ID)
	emit := func(ops []loadOp) {
		r.seq++
		out = append(out, appendLoadBatch(nil, &loadBatch{origin: r.cfg.ID, incarnation: r.incarnation, seq: r.seq, ops: ops}))
	}
	cs, start := newChunkSize(r.payloadBudget(), MaxLoadBatch, header), 0
	for i := range r.pending {
		n := loadOpBytes(&r.pending[i])
		if cs.full(n) {
			emit(r.pending[start:i])
			start = i
			cs.next(header)
		}
		cs.add(n)
	}
	if start < len(r.pending) {
		emit(r.pending[start:])
	}
	r.pending = r.pending[:0]
	return out
}

// publishAll publishes msgs on subject, logging failures (peers notice the
// lost ones by their sequence numbers).
func (r *Replica) publishAll(subject string, msgs [][]byte) {
	for _, m := range msgs {
		if err := publishWire(r.cfg.Conn, subject, "", m); err != nil {
			r.log.Warn("natsx: publish failed", "subject", subject, "bytes", len(m), "err", err)
		}
	}
}

// flushLoad publishes the pending own operations.
func (r *Replica) flushLoad() {
	r.mu.Lock()
	msgs := r.takeBatchesLocked()
	r.mu.Unlock()
	r.publishAll(loadSubject(r.cfg.Prefix), msgs)
}

// heartbeat publishes the pending operations and then a batch without
// operations carrying the current sequence number; it also ends own
// requests past their deadline (their router's tracker expires them too).
func (r *Replica) heartbeat(now time.Time) {
	r.mu.Lock()
	for id, o := range r.own {
		if now.After(o.deadline) {
			delete(r.own, id)
			r.pending = append(r.pending, loadOp{op: opFree, id: id})
		}
	}
	msgs := r.takeBatchesLocked()
	msgs = append(msgs, appendLoadBatch(nil, &loadBatch{origin: r.cfg.ID, incarnation: r.incarnation, seq: r.seq}))
	r.mu.Unlock()
	r.publishAll(loadSubject(r.cfg.Prefix), msgs)
}

// serveActive answers a peer's request for this replica's active requests:
// the pending operations are published first, so the snapshot is exactly
// the state after the last numbered batch. A chunk holds at most
// dumpChunkItems requests and about payloadBudget bytes.
func (r *Replica) serveActive(reply string) {
	now := time.Now()
	cs := newChunkSize(r.payloadBudget(), dumpChunkItems, msgFixedBytes)
	r.mu.Lock()
	msgs := r.takeBatchesLocked()
	c := &activeChunk{incarnation: r.incarnation, seq: r.seq}
	var chunks [][]byte
	for _, o := range r.own {
		n := activeReqFixedBytes + loadOpBytes(&o.op)
		if cs.full(n) {
			chunks = append(chunks, appendActiveChunk(nil, c))
			c = &activeChunk{index: c.index + 1, incarnation: c.incarnation, seq: c.seq}
			cs.next(msgFixedBytes)
		}
		c.reqs = append(c.reqs, activeReq{ttlMillis: max(o.deadline.Sub(now).Milliseconds(), 1), op: o.op})
		cs.add(n)
	}
	c.final = true
	chunks = append(chunks, appendActiveChunk(nil, c))
	r.mu.Unlock()
	r.publishAll(loadSubject(r.cfg.Prefix), msgs)
	r.publishAll(reply, chunks)
}

// Run subscribes, syncs from a peer and keeps the index and load in step
// until ctx ends; then it unsubscribes, publishes pending load operations
// and returns nil once the repairs it started have ended. It returns
// ErrRunning if already running, or an error when subscribing fails.
// Run may be called again after it returned: the replica then starts over
// from a peer's dump, which replaces what the index held; Ready stays
// closed from the first sync.
func (r *Replica) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	var err error
	if r.replies, err = openReplies(r.cfg.Conn); err != nil {
		return fmt.Errorf("natsx: subscribe replies: %w", err)
	}
	defer r.replies.close()
	ctx, cancel := context.WithCancel(ctx)
	l := &loop{r: r, ctx: ctx, conn: r.cfg.Conn, ch: make(chan *nats.Msg, queueLen),
		last: map[kvroute.WorkerKey]uint64{}, epochs: map[kvroute.WorkerKey]uint64{}, repairs: map[kvroute.WorkerKey]*repairState{},
		peers: map[string]*peerState{}, repaired: make(chan repairResult, 16), resynced: make(chan resyncResult, 16)}
	defer func() {
		cancel()
		l.wg.Wait()
		for _, s := range l.subs {
			_ = s.Unsubscribe()
		}
		if l.serving != nil {
			_ = l.serving.Unsubscribe()
		}
	}()
	return l.run()
}

// loop is the state of one Run, owned by its goroutine.
type loop struct {
	r       *Replica
	ctx     context.Context
	conn    *nats.Conn
	ch      chan *nats.Msg
	subs    []*nats.Subscription
	serving *nats.Subscription // the whole-dump service, once in sync
	inbox   string             // prefix of the start-up dump inboxes
	wg      sync.WaitGroup     // repairs and resyncs in flight

	start    *syncState                         // the start-up dump, until applied
	last     map[kvroute.WorkerKey]uint64       // last event ID applied per worker
	epochs   map[kvroute.WorkerKey]uint64       // the Publisher whose sequence last follows, from its heads
	repairs  map[kvroute.WorkerKey]*repairState // workers being repaired
	gen      uint64                             // the last repair started
	peers    map[string]*peerState
	repaired chan repairResult
	resynced chan resyncResult

	ev    kvroute.Event
	dyn   kvevents.DynamoEvent
	batch loadBatch
}

// syncState is the start-up dump being received.
type syncState struct {
	inbox    string
	attempt  int
	next     uint64 // next chunk index
	chunks   []*dumpChunk
	held     []*nats.Msg // events received meanwhile
	deadline *time.Timer
}

// repairState is a worker being repaired: need is the event ID the repair
// must reach, held the worker's events received since the gap, gen the
// number of the repair, which its result carries.
type repairState struct {
	need uint64
	gen  uint64
	held []*nats.Msg
}

// peerState is another replica's load as this one knows it.
type peerState struct {
	incarnation uint64
	seq         uint64    // last load batch applied
	heard       time.Time // last message
	reqs        map[scheduling.RequestID]*peerReq
	resyncing   bool
	held        []loadBatch // batches received while resyncing
}

// peerReq is a peer's request in the local tracker.
type peerReq struct {
	deadline time.Time
}

func (l *loop) subscribe(subj string, queue string) (*nats.Subscription, error) {
	var s *nats.Subscription
	var err error
	if queue == "" {
		s, err = l.conn.ChanSubscribe(subj, l.ch)
	} else {
		s, err = l.conn.ChanQueueSubscribe(subj, queue, l.ch)
	}
	if err != nil {
		return nil, fmt.Errorf("natsx: subscribe %s: %w", subj, err)
	}
	return s, nil
}

func (l *loop) run() error {
	r, p := l.r, l.r.cfg.Prefix
	l.inbox = l.conn.NewRespInbox()
	for _, subj := range []string{eventsSubject(p), loadSubject(p), headsSubject(p), haveSubject(p),
		workerDumpSubject(p, r.cfg.ID), activeSubject(p, r.cfg.ID), l.inbox + ".*"} {
		s, err := l.subscribe(subj, "")
		if err != nil {
			return err
		}
		l.subs = append(l.subs, s)
	}
	if err := l.conn.Flush(); err != nil {
		return fmt.Errorf("natsx: flush: %w", err)
	}
	l.startSync(0)
	flushTimer := time.NewTimer(time.Hour)
	flushTimer.Stop()
	defer flushTimer.Stop()
	armed := false
	tick := time.NewTicker(r.cfg.LoadHeartbeat)
	defer tick.Stop()
	for {
		if l.start == nil && l.serving == nil {
			var err error
			if l.serving, err = l.subscribe(dumpSubject(p), "dump"); err != nil {
				return err
			}
		}
		var deadline <-chan time.Time
		if l.start != nil {
			deadline = l.start.deadline.C
		}
		select {
		case <-l.ctx.Done():
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
		case now := <-tick.C:
			r.heartbeat(now)
			l.sweepPeers(now)
		case <-deadline:
			if len(l.start.chunks) > 0 {
				r.log.Warn("natsx: dump incomplete, asking again")
				l.startSync(l.start.attempt)
				continue
			}
			l.finishSync() // nobody answered: the first replica
		case res := <-l.repaired:
			l.finishRepair(res)
		case res := <-l.resynced:
			l.finishResync(res)
		case m := <-l.ch:
			l.dispatch(m)
		}
	}
}

func (l *loop) dispatch(m *nats.Msg) {
	r := l.r
	if !r.readable(m) {
		return
	}
	switch {
	case m.Sub == l.subs[0]: // events
		r.stats.events.Add(1)
		if l.start != nil {
			l.start.held = append(l.start.held, m)
			return
		}
		l.handleEvent(m)
	case m.Sub == l.subs[1]: // load
		l.handleLoad(m.Data)
	case m.Sub == l.subs[2]: // heads
		if l.start == nil {
			l.handleHeads(m.Data)
		}
	case m.Sub == l.subs[3]: // have
		h, err := decodeHaveReq(m.Data)
		if err != nil {
			r.stats.malformed.Add(1)
			return
		}
		if h.from != r.cfg.ID && m.Reply != "" {
			// "+id" when in sync with the worker, "~" when merely behind
			// (it may catch up in a moment), "-" otherwise, so the asker
			// need not wait for a timeout to try the relay.
			// A replica on another relay's sequence than the asker's
			// answers "-": its events are not the ones the asker lacks.
			answer := "-"
			w := h.want.worker
			switch _, ok := l.last[w]; {
			case l.inSync(w, h.want.id, h.want.epoch):
				answer = "+" + r.cfg.ID
			case l.start == nil && ok && l.repairs[w] == nil && l.sameEpoch(w, h.want.epoch):
				answer = "~"
			}
			_ = publishWire(l.conn, m.Reply, "", []byte(answer))
		}
	case m.Sub == l.subs[4]: // a worker's dump
		ws, err := readWorkerIDsMsg(m.Data)
		if err != nil || len(ws) != 1 || m.Reply == "" {
			r.stats.malformed.Add(1)
			return
		}
		l.serveDump(m.Reply, &ws[0])
	case m.Sub == l.subs[5]: // our active requests
		if m.Reply != "" {
			r.serveActive(m.Reply)
		}
	case l.serving != nil && m.Sub == l.serving: // a whole dump
		if string(m.Data) != r.cfg.ID && m.Reply != "" {
			l.serveDump(m.Reply, nil)
		}
	case m.Sub == l.subs[6]: // a chunk of the start-up dump
		l.handleStartChunk(m)
	}
}

// readable reports whether m is of a wire version this replica reads; it
// counts and logs those that are not.
func (r *Replica) readable(m *nats.Msg) bool {
	err := checkWire(m.Header)
	switch {
	case err == nil:
		return true
	case errors.Is(err, errWireVersion):
		// Logged at Warn the 1st, 2nd, 4th, 8th... time: every message
		// of a newer peer or relay is dropped.
		if n := r.stats.newerWire.Add(1); n&(n-1) == 0 {
			r.log.Warn("natsx: message of a newer wire version dropped; upgrade this replica",
				"subject", m.Subject, "err", err, "dropped", n)
		}
	default:
		r.stats.malformed.Add(1)
	}
	return false
}

// readWorkerIDsMsg decodes a message that is a list of worker IDs.
func readWorkerIDsMsg(p []byte) ([]workerID, error) {
	ws, _, err := readWorkerIDs(p)
	return ws, err
}

// inSync reports whether this replica has applied w's events through id
// of the sequence of relay epoch (0: of whichever relay). A worker being
// repaired counts too: its index holds exactly its events through
// l.last[w] until the repair's result is applied, at once, on this
// goroutine.
func (l *loop) inSync(w kvroute.WorkerKey, id, epoch uint64) bool {
	if l.start != nil {
		return false
	}
	last, ok := l.last[w]
	return ok && last >= id && l.sameEpoch(w, epoch)
}

// sameEpoch reports whether w's sequence here is that of relay epoch,
// where epoch 0 (an asker that does not know) means any relay's. A
// sequence whose relay this replica does not know is not taken for any
// relay's: it may be another relay's than the asker's.
func (l *loop) sameEpoch(w kvroute.WorkerKey, epoch uint64) bool {
	return epoch == 0 || l.epochs[w] == epoch
}

// decodeEvent decodes an event message into l.ev.
func (l *loop) decodeEvent(data []byte) bool {
	if _, err := kvevents.DecodeDynamoEvent(data, &l.dyn); err != nil {
		l.r.stats.malformed.Add(1)
		return false
	}
	if err := l.dyn.ToEvent(&l.ev); err != nil {
		l.r.stats.malformed.Add(1)
		return false
	}
	return true
}

// handleEvent applies one event message, or holds it while its worker is
// being repaired, or starts a repair when it reveals a gap.
func (l *loop) handleEvent(m *nats.Msg) {
	r := l.r
	if !l.decodeEvent(m.Data) {
		return
	}
	ev := &l.ev
	w := ev.Worker
	if rep := l.repairs[w]; rep != nil {
		rep.held = append(rep.held, m)
		return
	}
	if ev.ID == 0 {
		if ev.Kind == kvroute.EventCleared {
			// The relay's new-sequence marker: its events of w start at 1,
			// and the marker names the relay. A marker without its epoch
			// (a relay of an older version) leaves it unknown: the first
			// heads of the worker then start it over (handleHeads).
			r.cfg.Index.ResetWorker(w)
			l.last[w] = 0
			if e := markerEpoch(m.Header); e != 0 {
				l.epochs[w] = e
			} else {
				delete(l.epochs, w)
			}
			r.stats.applied.Add(1)
			return
		}
		l.apply(ev)
		return
	}
	last := l.last[w]
	switch {
	case ev.ID <= last:
		return // a duplicate, or covered by a dump
	case ev.ID > last+1:
		r.stats.gaps.Add(1)
		r.log.Info("natsx: event gap", "worker", w.String(), "want", last+1, "got", ev.ID)
		l.startRepair(w, ev.ID-1)
		l.repairs[w].held = append(l.repairs[w].held, m)
		return
	}
	l.apply(ev)
	l.last[w] = ev.ID
}

// apply applies ev to the index. The replica checks sequences itself and
// calls apply only with events in order, so a gap or duplicate the index
// reports means that the index's own sequence position is stale (the host
// applied events to it too): the event is applied again unsequenced,
// keeping the worker's blocks, rather than dropped or taken as a reason to
// reset the worker.
func (l *loop) apply(ev *kvroute.Event) {
	r := l.r
	err := r.cfg.Index.Apply(ev)
	if errors.Is(err, indexer.ErrGap) || errors.Is(err, indexer.ErrDuplicate) {
		r.log.Debug("natsx: index's sequence differs, event applied unsequenced", "event", ev.String(), "err", err)
		id := ev.ID
		ev.ID = 0
		err = r.cfg.Index.Apply(ev)
		ev.ID = id
	}
	if err == nil {
		r.stats.applied.Add(1)
		return
	}
	r.stats.applyErrs.Add(1)
	r.log.Debug("natsx: index rejected event", "event", ev.String(), "err", err)
}

// handleHeads starts a repair of every worker the relay has published
// more events of than this replica applied (events lost at the end of a
// burst show no gap in the stream).
//
// A worker's sequence here is known to be the announcing relay's only
// when its epoch is the heads' epoch. When it is another relay's, this
// replica missed the new relay's marker; when its relay is not known (a
// marker or a dump without the epoch, a repair from a peer that did not
// know it, a first event seen without its marker), it may be an old
// relay's sequence, or of another lineage, whatever its last event ID. In
// both cases the replica does not take itself for in sync: the worker
// starts over from the relay's first event, repaired from a peer on the
// relay's sequence or from the relay's replay (or reset, when neither
// can). Only a worker of which nothing was applied yet, and none is under
// repair, takes the relay's epoch as it is.
func (l *loop) handleHeads(data []byte) {
	h, err := decodeHeads(data)
	if err != nil {
		l.r.stats.malformed.Add(1)
		return
	}
	for _, x := range h.last {
		switch e, known := l.epochs[x.worker]; {
		case known && e == h.epoch: // on this relay's sequence
		case !known && l.last[x.worker] == 0 && l.repairs[x.worker] == nil:
			l.epochs[x.worker] = h.epoch // nothing of any sequence applied yet
		default:
			l.r.stats.gaps.Add(1)
			if known {
				l.r.log.Info("natsx: missed a relay restart", "worker", x.worker.String(), "head", x.id)
			} else {
				l.r.log.Info("natsx: sequence of an unknown relay, starting the worker over",
					"worker", x.worker.String(), "have", l.last[x.worker], "head", x.id)
			}
			l.r.cfg.Index.ResetWorker(x.worker)
			l.last[x.worker] = 0
			l.epochs[x.worker] = h.epoch
			delete(l.repairs, x.worker) // a repair of the old sequence: finishRepair ignores its result
		}
		if x.id > l.last[x.worker] && l.repairs[x.worker] == nil {
			l.r.stats.gaps.Add(1)
			l.r.log.Info("natsx: events lost at the tail", "worker", x.worker.String(), "have", l.last[x.worker], "head", x.id)
			l.startRepair(x.worker, x.id)
		}
	}
}

// repairKind says how a repair ended.
type repairKind uint8

const (
	byReset repairKind = iota
	byDump
	byReplay
)

// repairResult is what a repair goroutine fetched for worker.
type repairResult struct {
	worker kvroute.WorkerKey
	gen    uint64 // repairState.gen of the repair that fetched it
	kind   repairKind
	last   uint64       // byDump: the peer's last event ID
	epoch  uint64       // byDump: the relay of the peer's sequence, when it knows
	chunks []*dumpChunk // byDump: the worker's blocks
	msgs   [][]byte     // byReplay: the event messages
}

// startRepair marks w as being repaired up to need and fetches, on a
// goroutine, a peer's dump of w or the relay's replay.
func (l *loop) startRepair(w kvroute.WorkerKey, need uint64) {
	l.gen++
	gen := l.gen
	l.repairs[w] = &repairState{need: need, gen: gen}
	have, epoch, peers := l.last[w], l.epochs[w], len(l.peers)
	l.wg.Go(func() {
		res := l.r.repair(l.ctx, w, have, need, epoch, peers)
		res.gen = gen
		select {
		case l.repaired <- res:
		case <-l.ctx.Done():
		}
	})
}

// repairAttempts bounds the tries of a repair whose requests went
// unanswered (a NATS reconnect) before the worker is reset.
const repairAttempts = 3

// repair fetches what worker w needs to go from event have to need: a
// dump from an in-sync peer, else the relay's replay, else nothing (the
// worker will be reset). peers is the number of peers known from the load
// sync: once that many said they are not in sync, the relay is asked
// without waiting longer. When the relay does not answer at all (the
// connection is down or reconnecting), the repair waits for the
// connection and tries again, up to repairAttempts times; only the
// relay's answer that it no longer holds the events, or no relay serving
// replays, resets the worker at once. epoch is the relay whose sequence
// the worker follows here (0: not known yet): only a peer on the same
// sequence may serve the repair.
func (r *Replica) repair(ctx context.Context, w kvroute.WorkerKey, have, need, epoch uint64, peers int) repairResult {
	res := repairResult{worker: w}
	for attempt := 1; ; attempt++ {
		done, final := r.repairOnce(ctx, &res, have, need, epoch, peers)
		if done || final || attempt == repairAttempts || ctx.Err() != nil {
			return res
		}
		r.waitConnected(ctx)
	}
}

// waitConnected waits, up to SyncTimeout, for the connection to be up.
func (r *Replica) waitConnected(ctx context.Context) {
	deadline := time.Now().Add(r.cfg.SyncTimeout)
	for !r.cfg.Conn.IsConnected() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
}

// repairOnce tries a peer's dump and then the relay's replay once. It
// reports whether res is filled, and whether the answer is final (the
// relay said it cannot help).
func (r *Replica) repairOnce(ctx context.Context, res *repairResult, have, need, epoch uint64, peers int) (done, final bool) {
	p, w := r.cfg.Prefix, res.worker
	want := workerID{worker: w, id: need, epoch: epoch}
	peer, behind := r.findPeer(ctx, want, peers)
	// A peer that is only behind has the events in a moment: ask again
	// while one says so (peers that lost the events too soon say they
	// repair), for up to SyncTimeout.
	for wait, end := 10*time.Millisecond, time.Now().Add(r.cfg.SyncTimeout); peer == "" && behind && time.Now().Before(end); wait = min(2*wait, 160*time.Millisecond) {
		select {
		case <-ctx.Done():
			return false, true
		case <-time.After(wait):
		}
		peer, behind = r.findPeer(ctx, want, peers)
	}
	if peer != "" {
		var last, lastEpoch uint64
		var chunks []*dumpChunk
		err := r.fetch(ctx, workerDumpSubject(p, peer), appendWorkerIDs(nil, []workerID{{worker: w, epoch: epoch}}),
			func(data []byte) (uint64, bool, error) {
				c, err := decodeDumpChunk(data)
				if err != nil {
					return 0, false, err
				}
				if c.index == 0 {
					if len(c.last) != 1 || c.last[0].worker != w || (epoch != 0 && c.last[0].epoch != epoch) {
						return 0, false, errNotAvailable // the peer fell out of sync, or cannot tell its relay
					}
					last, lastEpoch = c.last[0].id, c.last[0].epoch
				}
				chunks = append(chunks, c)
				return c.index, c.final, nil
			})
		if err == nil && last >= need {
			res.kind, res.last, res.epoch, res.chunks = byDump, last, lastEpoch, chunks
			return true, true
		}
		r.log.Debug("natsx: peer dump failed", "worker", w.String(), "err", err)
	}
	if ctx.Err() != nil {
		return false, true
	}
	var msgs [][]byte
	err := r.fetch(ctx, replaySubject(p), appendReplayReq(nil, &replayReq{worker: w, from: have + 1, to: need}),
		func(data []byte) (uint64, bool, error) {
			c, err := decodeReplayChunk(data)
			if err != nil {
				return 0, false, err
			}
			if !c.ok {
				return 0, false, errNotAvailable
			}
			for _, m := range c.msgs {
				msgs = append(msgs, append([]byte(nil), m...))
			}
			return c.index, c.final, nil
		})
	if err == nil && replayReaches(msgs, have, need) {
		res.kind, res.msgs = byReplay, msgs
		return true, true
	}
	r.log.Info("natsx: no replay for worker", "worker", w.String(), "from", have+1, "to", need, "err", err)
	return false, errors.Is(err, errNotAvailable) || errors.Is(err, nats.ErrNoResponders) || err == nil
}

// replayReaches reports whether msgs, a relay's replay of a worker's
// events have+1..need, takes the worker to need: it holds them all, or
// starts at a reset of the worker after have (the relay keeps nothing of
// a worker from before its last reset, which clears it anyway) and holds
// every event from there.
func replayReaches(msgs [][]byte, have, need uint64) bool {
	n := uint64(len(msgs))
	switch {
	case n == need-have:
		return true
	case n == 0 || n > need-have:
		return false
	}
	var d kvevents.DynamoEvent
	if _, err := kvevents.DecodeDynamoEvent(msgs[0], &d); err != nil {
		return false
	}
	return d.Kind == kvevents.DynamoCleared && d.EventID+1 == need-n+1
}

// findPeer asks the peers which of them is in sync with want.worker
// through event want.id of relay want.epoch and returns the first that
// is, or "" when none says so in time; behind reports that a peer said it
// is behind (not repairing the worker).
func (r *Replica) findPeer(ctx context.Context, want workerID, peers int) (peer string, behind bool) {
	wait := r.cfg.SyncTimeout
	if peers == 0 {
		wait /= 4 // no peer known: a short look, for peers not heard yet
	}
	inbox, answers, end := r.replies.request()
	defer end()
	if err := publishWire(r.cfg.Conn, haveSubject(r.cfg.Prefix), inbox,
		appendHaveReq(nil, &haveReq{from: r.cfg.ID, want: want})); err != nil {
		return "", false
	}
	// Once a peer has answered, the others get a short grace only: a peer
	// far behind on its queue would hold the repair up for long.
	all := withTimeout(ctx, wait)
	next := all
	for no := 0; peers == 0 || no < peers; no++ {
		m, err := nextReply(next, answers)
		if err != nil {
			return "", behind
		}
		if no == 0 {
			next = withTimeout(all, wait/10)
		}
		if !r.readable(m) {
			continue // an answer this replica cannot read: not a yes
		}
		switch {
		case len(m.Data) > 1 && m.Data[0] == '+':
			return string(m.Data[1:]), false
		case len(m.Data) == 1 && m.Data[0] == '~':
			behind = true
		}
	}
	return "", behind
}

// withTimeout returns ctx bounded by d; the bound's resources are freed
// when ctx ends or d passes.
func withTimeout(ctx context.Context, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(ctx, d)
	context.AfterFunc(c, cancel)
	return c
}

// fetch sends req on subject with a fresh inbox as reply subject and feeds
// the chunks that come back, in order, to chunk (which returns the chunk's
// index and whether it is the last) until the final one. Each chunk must
// come within SyncTimeout.
func (r *Replica) fetch(ctx context.Context, subject string, req []byte, chunk func([]byte) (uint64, bool, error)) error {
	inbox, answers, end := r.replies.request()
	defer end()
	if err := publishWire(r.cfg.Conn, subject, inbox, req); err != nil {
		return err
	}
	for next := uint64(0); ; next++ {
		m, err := nextReply(withTimeout(ctx, r.cfg.SyncTimeout), answers)
		if err != nil {
			return err
		}
		final, err := fetchReply(m, next, chunk)
		if err != nil || final {
			return err
		}
	}
}

// fetchReply takes reply m of a fetch, which must be chunk next: it
// returns nats.ErrNoResponders for the server's 503 status (nobody serves
// the subject), chunk's error, or an error wrapping kvevents.ErrMalformed
// when the chunk's index is not next.
func fetchReply(m *nats.Msg, next uint64, chunk func([]byte) (uint64, bool, error)) (final bool, err error) {
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return false, nats.ErrNoResponders
	}
	if err := checkWire(m.Header); err != nil {
		return false, err
	}
	i, final, err := chunk(m.Data)
	if err != nil {
		return false, err
	}
	if i != next {
		return false, fmt.Errorf("%w: chunk %d, want %d", kvevents.ErrMalformed, i, next)
	}
	return final, nil
}

// finishRepair applies a repair's result, then the worker's held events.
// A result of another repair than the one under way for the worker (one
// abandoned when the relay restarted, whose peer dump or replay belongs
// to the old sequence) is ignored.
func (l *loop) finishRepair(res repairResult) {
	r := l.r
	w := res.worker
	rep := l.repairs[w]
	if rep == nil || rep.gen != res.gen {
		r.log.Debug("natsx: result of an abandoned repair ignored", "worker", w.String())
		return
	}
	delete(l.repairs, w)
	switch res.kind {
	case byDump:
		r.cfg.Index.ResetWorker(w)
		for _, c := range res.chunks {
			l.applyDump(c, &w)
		}
		// The worker is now the peer's, of the peer's relay (when the
		// repair named one, the peer's is that one).
		l.last[w] = res.last
		if res.epoch != 0 {
			l.epochs[w] = res.epoch
		} else {
			delete(l.epochs, w)
		}
		r.stats.byDump.Add(1)
	case byReplay:
		for i, m := range res.msgs {
			// The replay may start at a reset of the worker (replayReaches).
			if !l.decodeEvent(m) || l.ev.Worker != w || (l.ev.ID != l.last[w]+1 &&
				!(i == 0 && l.ev.Kind == kvroute.EventCleared && l.ev.ID > l.last[w])) {
				r.stats.malformed.Add(1)
				continue
			}
			l.apply(&l.ev)
			l.last[w] = l.ev.ID
		}
		r.stats.byReplay.Add(1)
	default:
		// Neither a peer nor the relay has the lost events: start the
		// worker afresh from the next one.
		r.cfg.Index.ResetWorker(w)
		l.last[w] = rep.need
		r.stats.resets.Add(1)
		r.log.Warn("natsx: worker reset after a gap nothing could repair", "worker", w.String(), "next", rep.need+1)
	}
	for _, m := range rep.held {
		l.handleEvent(m)
	}
}

// startSync asks a peer for a whole dump (attempt counts the asks).
func (l *loop) startSync(attempt int) {
	var held []*nats.Msg
	if l.start != nil {
		held = l.start.held
		l.start.deadline.Stop()
	}
	attempt++
	l.start = &syncState{inbox: l.inbox + "." + strconv.Itoa(attempt), attempt: attempt, held: held,
		deadline: time.NewTimer(l.r.cfg.SyncTimeout)}
	if err := publishWire(l.conn, dumpSubject(l.r.cfg.Prefix), l.start.inbox, []byte(l.r.cfg.ID)); err != nil {
		l.r.log.Warn("natsx: dump request failed", "err", err)
	}
}

// handleStartChunk takes one chunk of the start-up dump.
func (l *loop) handleStartChunk(m *nats.Msg) {
	st := l.start
	if st == nil || m.Subject != st.inbox {
		return // a late reply to an earlier attempt
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		l.finishSync() // no responders: no other replica is in sync yet
		return
	}
	c, err := decodeDumpChunk(m.Data)
	if err != nil || c.index != st.next {
		l.r.stats.malformed.Add(1)
		l.r.log.Warn("natsx: bad dump chunk, asking again", "err", err)
		l.startSync(st.attempt)
		return
	}
	st.next++
	st.chunks = append(st.chunks, c)
	// SyncTimeout bounds the silence between chunks, not the whole dump.
	if !st.deadline.Stop() {
		select {
		case <-st.deadline.C:
		default:
		}
	}
	st.deadline.Reset(l.r.cfg.SyncTimeout)
	if c.final {
		l.finishSync()
	}
}

// finishSync applies the start-up dump (if any) and the events held
// meanwhile. A dump replaces what the index held: every worker is reset
// first, so that blocks removed while this replica was not running leave
// the index and its sequence positions follow the dump. Without a dump a
// replica that ran before resets every worker as well, since what it
// holds lags by the events it missed; a first run keeps the index as the
// host gave it.
func (l *loop) finishSync() {
	r, st := l.r, l.start
	l.start = nil
	st.deadline.Stop()
	if len(st.chunks) > 0 || r.stats.syncs.Load() > 0 {
		for _, w := range r.cfg.Index.Workers() {
			r.cfg.Index.ResetWorker(w)
		}
	}
	for _, c := range st.chunks {
		for _, x := range c.last {
			l.last[x.worker] = x.id
			if x.epoch != 0 {
				l.epochs[x.worker] = x.epoch // the next heads of another relay reveal a stale sequence
			}
		}
		l.applyDump(c, nil)
	}
	r.stats.syncs.Add(1)
	r.once.Do(func() { close(r.ready) })
	r.log.Debug("natsx: synced", "chunks", len(st.chunks), "held", len(st.held))
	for _, m := range st.held {
		l.handleEvent(m)
	}
}

// applyDump applies the events of dump chunk c, unsequenced; with only
// set, those of worker *only alone (any other is counted malformed).
func (l *loop) applyDump(c *dumpChunk, only *kvroute.WorkerKey) {
	for i := range c.events {
		if err := c.events[i].ToEvent(&l.ev); err != nil || (only != nil && l.ev.Worker != *only) {
			l.r.stats.malformed.Add(1)
			continue
		}
		l.ev.ID = 0
		l.ev.SeqHashes = c.seqHashes && l.ev.Kind == kvroute.EventStored
		l.apply(&l.ev)
	}
}

// workerDumper is an Index that dumps one worker at the cost of its own
// blocks (*indexer.Index does); serveDump uses it for one worker's dump,
// where Index.Dump would walk every worker before it.
type workerDumper interface {
	DumpWorker(w kvroute.WorkerKey, fn func(*kvroute.Event) error) error
}

// errStop ends a dump early.
var errStop = errors.New("natsx: stop")

// serveDump streams the index of worker only.worker (or of every worker,
// when only is nil) with the last event IDs and their relays' epochs to
// reply, in chunks. A worker this replica is not in sync with, or whose
// sequence here is of another relay than only.epoch, gets a first chunk
// without last IDs.
func (l *loop) serveDump(reply string, only *workerID) {
	r := l.r
	c := &dumpChunk{}
	var onlyWorker kvroute.WorkerKey
	switch {
	case only != nil:
		onlyWorker = only.worker
		if last, ok := l.last[onlyWorker]; ok && l.inSync(onlyWorker, last, only.epoch) {
			c.last = append(c.last, workerID{worker: onlyWorker, id: last, epoch: l.epochs[onlyWorker]})
		} else {
			c.final = true
			buf, _ := appendDumpChunk(nil, c)
			_ = publishWire(r.cfg.Conn, reply, "", buf)
			return
		}
	default:
		for w, id := range l.last {
			c.last = append(c.last, workerID{worker: w, id: id, epoch: l.epochs[w]})
		}
	}
	// A chunk is closed before an event would take it past the payload
	// budget or dumpChunkItems events.
	cs := newChunkSize(r.payloadBudget(), dumpChunkItems, msgFixedBytes+len(appendWorkerIDs(nil, c.last)))
	var buf, scratch []byte
	send := func(final bool) error {
		c.final = final
		var err error
		if buf, err = appendDumpChunk(buf[:0], c); err != nil {
			return err
		}
		if err := publishVersion(r.cfg.Conn, reply, "", buf, c.wireVersion()); err != nil {
			return fmt.Errorf("natsx: dump chunk %d of %d bytes: %w", c.index, len(buf), err)
		}
		c = &dumpChunk{index: c.index + 1}
		cs.next(msgFixedBytes)
		return nil
	}
	add := func(ev *kvroute.Event) error {
		stored := ev.Kind == kvroute.EventStored
		if stored && ev.SeqHashes != c.seqHashes && len(c.events) > 0 {
			// A chunk's Stored events carry one kind of hash.
			if err := send(false); err != nil {
				return err
			}
		}
		plain := *ev
		plain.SeqHashes = false // the chunk says what its hashes are
		var d kvevents.DynamoEvent
		if err := d.FromEvent(&plain, kvroute.Hasher{}); err != nil {
			return err
		}
		var err error
		if scratch, err = kvevents.AppendDynamoEvent(scratch[:0], &d); err != nil {
			return err
		}
		if cs.full(len(scratch)) {
			if err := send(false); err != nil {
				return err
			}
		}
		if stored {
			// Said of the chunk the event goes in, which may be a new
			// one: a chunk full of sequence hashes starts another.
			c.seqHashes = ev.SeqHashes
		}
		c.events = append(c.events, d)
		cs.add(len(scratch))
		return nil
	}
	dump := r.cfg.Index.Dump
	if wd, ok := r.cfg.Index.(workerDumper); ok && only != nil {
		dump = func(fn func(*kvroute.Event) error) error { return wd.DumpWorker(onlyWorker, fn) }
	}
	seen := false
	err := dump(func(ev *kvroute.Event) error {
		switch {
		case only != nil && ev.Worker != onlyWorker:
			if seen {
				return errStop // workers come one by one: done
			}
			return nil
		}
		seen = true
		if ev.Kind != kvroute.EventRemoved || len(ev.Removed) <= dumpRemovedPerEvent {
			return add(ev)
		}
		// A long list of removals (the placeholders of evicted
		// ancestors) goes in several events, in order.
		part := *ev
		for rest := ev.Removed; len(rest) > 0; rest = rest[len(part.Removed):] {
			part.Removed = rest[:min(len(rest), dumpRemovedPerEvent)]
			if err := add(&part); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil || errors.Is(err, errStop) {
		err = send(true)
	}
	if err != nil {
		r.log.Warn("natsx: serving a dump failed", "err", err)
		return
	}
	r.stats.dumps.Add(1)
}

// handleLoad applies a peer's load batch, in sequence; a gap, an unknown
// peer that is already under way, or a restarted peer starts a resync of
// its requests.
func (l *loop) handleLoad(data []byte) {
	r := l.r
	if err := decodeLoadBatch(data, &l.batch); err != nil {
		r.stats.malformed.Add(1)
		return
	}
	b := &l.batch
	if b.origin == r.cfg.ID || r.cfg.Tracker == nil {
		return // our own echo
	}
	ps := l.peers[b.origin]
	switch {
	case ps != nil && b.incarnation < ps.incarnation:
		return // from before the peer restarted
	case ps != nil && b.incarnation > ps.incarnation:
		l.dropPeer(b.origin, ps) // the peer restarted: its old requests are gone
		ps = nil
	}
	if ps == nil {
		ps = &peerState{incarnation: b.incarnation, reqs: map[scheduling.RequestID]*peerReq{}}
		l.peers[b.origin] = ps
	}
	ps.heard = time.Now()
	switch {
	case ps.resyncing:
		if len(b.ops) > 0 {
			ps.held = append(ps.held, cloneBatch(b))
		}
	case len(b.ops) == 0: // a heartbeat
		if b.seq > ps.seq {
			l.startResync(b.origin, ps)
		}
	case b.seq <= ps.seq:
	case b.seq == ps.seq+1:
		l.applyPeerOps(b.origin, ps, b.ops)
		ps.seq = b.seq
	default:
		l.startResync(b.origin, ps)
		ps.held = append(ps.held, cloneBatch(b))
	}
}

func cloneBatch(b *loadBatch) loadBatch {
	c := *b
	c.ops = append([]loadOp(nil), b.ops...)
	return c
}

// applyPeerOps applies a peer's operations to the local tracker.
func (l *loop) applyPeerOps(origin string, ps *peerState, ops []loadOp) {
	r, tr := l.r, l.r.cfg.Tracker
	now := time.Now()
	eased := false
	for i := range ops {
		op := &ops[i]
		r.stats.loadOps.Add(1)
		lid := LocalID(origin, op.id)
		switch op.op {
		case opAdd:
			if ps.reqs[op.id] != nil {
				continue
			}
			if len(ps.reqs) >= r.cfg.MaxPeerRequests {
				r.stats.overflow.Add(1)
				continue
			}
			if err := tr.Add(lid, op.worker, op.blocks, op.prefillTokens); err != nil {
				continue
			}
			if op.prefillDone {
				tr.PrefillDone(lid)
			}
			if op.output > 0 {
				tr.AddOutputTokens(lid, op.output)
			}
			ps.reqs[op.id] = &peerReq{deadline: now.Add(r.ttl)}
		case opPrefillDone:
			if pr := ps.reqs[op.id]; pr != nil {
				tr.PrefillDone(lid)
				pr.deadline = now.Add(r.ttl)
				eased = true
			}
		case opOutput:
			if pr := ps.reqs[op.id]; pr != nil {
				tr.AddOutputTokens(lid, op.output)
				pr.deadline = now.Add(r.ttl)
			}
		case opFree:
			if ps.reqs[op.id] != nil {
				tr.Free(lid)
				delete(ps.reqs, op.id)
				eased = true
			}
		}
	}
	if eased && r.cfg.OnPeerLoad != nil {
		r.cfg.OnPeerLoad()
	}
}

// dropPeer frees every request of peer origin and forgets it.
func (l *loop) dropPeer(origin string, ps *peerState) {
	for id := range ps.reqs {
		l.r.cfg.Tracker.Free(LocalID(origin, id))
	}
	delete(l.peers, origin)
	l.r.stats.drops.Add(1)
	if len(ps.reqs) > 0 && l.r.cfg.OnPeerLoad != nil {
		l.r.cfg.OnPeerLoad()
	}
}

// sweepPeers drops silent peers and peers' requests past their deadline.
func (l *loop) sweepPeers(now time.Time) {
	r := l.r
	eased := false
	for origin, ps := range l.peers {
		if now.Sub(ps.heard) > r.cfg.PeerTimeout {
			r.log.Info("natsx: peer silent, dropping its requests", "peer", origin, "requests", len(ps.reqs))
			l.dropPeer(origin, ps)
			continue
		}
		for id, pr := range ps.reqs {
			if now.After(pr.deadline) {
				r.cfg.Tracker.Free(LocalID(origin, id))
				delete(ps.reqs, id)
				eased = true
			}
		}
	}
	if eased && r.cfg.OnPeerLoad != nil {
		r.cfg.OnPeerLoad()
	}
}

// resyncResult is a peer's active-request snapshot, or the error that
// prevented it.
type resyncResult struct {
	origin      string
	incarnation uint64
	seq         uint64
	reqs        []activeReq
	err         error
}

// startResync fetches peer origin's active requests on a goroutine.
func (l *loop) startResync(origin string, ps *peerState) {
	if ps.resyncing {
		return
	}
	ps.resyncing = true
	l.r.stats.resyncs.Add(1)
	l.wg.Go(func() {
		res := resyncResult{origin: origin}
		res.err = l.r.fetch(l.ctx, activeSubject(l.r.cfg.Prefix, origin), nil, func(data []byte) (uint64, bool, error) {
			c, err := decodeActiveChunk(data)
			if err != nil {
				return 0, false, err
			}
			res.incarnation, res.seq = c.incarnation, c.seq
			res.reqs = append(res.reqs, c.reqs...)
			return c.index, c.final, nil
		})
		select {
		case l.resynced <- res:
		case <-l.ctx.Done():
		}
	})
}

// finishResync replaces a peer's requests by its snapshot and applies the
// batches held meanwhile.
func (l *loop) finishResync(res resyncResult) {
	r := l.r
	ps := l.peers[res.origin]
	if ps == nil {
		return
	}
	ps.resyncing = false
	held := ps.held
	ps.held = nil
	if res.err != nil || res.incarnation != ps.incarnation {
		// The next heartbeat tries again.
		r.log.Info("natsx: peer resync failed", "peer", res.origin, "err", res.err)
		ps.seq = 0
		return
	}
	tr := r.cfg.Tracker
	for id := range ps.reqs {
		tr.Free(LocalID(res.origin, id))
	}
	clear(ps.reqs)
	now := time.Now()
	for i := range res.reqs {
		a := &res.reqs[i]
		l.applyPeerOps(res.origin, ps, []loadOp{a.op})
		if pr := ps.reqs[a.op.id]; pr != nil {
			pr.deadline = now.Add(time.Duration(a.ttlMillis) * time.Millisecond)
		}
	}
	ps.seq = res.seq
	for i := range held {
		b := &held[i]
		switch {
		case b.seq <= ps.seq:
		case b.seq == ps.seq+1:
			l.applyPeerOps(res.origin, ps, b.ops)
			ps.seq = b.seq
		default:
			l.startResync(res.origin, ps)
			ps.held = append(ps.held, held[i:]...)
			return
		}
	}
	if r.cfg.OnPeerLoad != nil {
		r.cfg.OnPeerLoad()
	}
}
