package dynamo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
)

// Stats counts what a subscriber did. All fields only grow.
type Stats struct {
	// Received are messages received, of every topic. A message is
	// counted once it has been handled, so that whoever sees Received
	// reach n sees the other counters (and the sink) with the first n
	// messages in them; a recovery the message started may still be
	// under way.
	Received uint64
	// Malformed are messages (or payloads) that did not decode, and
	// events or load reports naming a data-parallel rank below their
	// worker's start rank (see Subscriber.SetDPStartRanks), skipped
	// without touching the index: the blocks a skipped kv-events message
	// stored are missing until the engine stores them again, and those it
	// removed stay indexed until removed or cleared again.
	Malformed uint64
	// Skipped are messages of topics the subscriber does not read
	// (active_sequences_events, or load topics without Config.Load).
	Skipped uint64
	// OtherResidency are events of another residency domain than their
	// worker's own (a cache owner's blocks, kvevents.ErrOtherResidency),
	// skipped as Dynamo's router skips them.
	OtherResidency uint64
	// Gaps are jumps in a publisher's sequence; Lost is the number of
	// messages they skipped over (see Subscriber for what is lost).
	Gaps, Lost uint64
	// Duplicates are messages whose sequence was already seen (a
	// publisher followed through two endpoints, a replaying broker).
	Duplicates uint64
	// Restarts are publishers that counted from 0 again; the workers they
	// reported were reset.
	Restarts uint64
	// Applied are events applied to the sink without error, also per kind.
	Applied                                       uint64
	AppliedStored, AppliedRemoved, AppliedCleared uint64
	// ApplyErrs are events the sink returned an error for;
	// UnknownParents the subset it rejected for an unknown parent block.
	ApplyErrs, UnknownParents uint64
	// Resets are worker resets sent to the sink.
	Resets uint64
	// LoadReports are heartbeats sent to Config.Load; LoadErrs those it
	// refused (a worker the router does not know yet, for instance).
	LoadReports, LoadErrs uint64
	// Reconnects are connections (re)established to publishers.
	Reconnects uint64

	// With a recovery target (Publisher.Recovery): Queries are worker KV
	// queries made, QueryErrs those that failed or found nothing to
	// recover; Restored are workers restored from a dump of their cache,
	// Recovered the events applied from queries; EventGaps are jumps in a
	// worker's event ids and LostEvents the events no query recovered;
	// StaleEvents are live events skipped because a recovery had already
	// applied them.
	Queries, QueryErrs, Restored, Recovered uint64
	EventGaps, LostEvents, StaleEvents      uint64
	// Abandoned are workers whose recovery was given up: their queries
	// kept failing for Config.RecoveryGiveUp, or the worker answered a
	// dump with a reset_scope other than "all" (see Subscriber).
	Abandoned uint64
}

// counters are Stats as atomics.
type counters struct {
	received, malformed, skipped, gaps, lost, duplicates, restarts atomic.Uint64
	otherResidency                                                 atomic.Uint64
	applied, stored, removed, cleared, applyErrs, unknownParents   atomic.Uint64
	resets, loadReports, loadErrs, reconnects                      atomic.Uint64
	queries, queryErrs, restored, recovered, eventGaps             atomic.Uint64
	lostEvents, staleEvents, abandoned                             atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Received: c.received.Load(), Malformed: c.malformed.Load(), Skipped: c.skipped.Load(),
		OtherResidency: c.otherResidency.Load(),
		Gaps:           c.gaps.Load(), Lost: c.lost.Load(), Duplicates: c.duplicates.Load(), Restarts: c.restarts.Load(),
		Applied: c.applied.Load(), AppliedStored: c.stored.Load(), AppliedRemoved: c.removed.Load(),
		AppliedCleared: c.cleared.Load(), ApplyErrs: c.applyErrs.Load(), UnknownParents: c.unknownParents.Load(),
		Resets: c.resets.Load(), LoadReports: c.loadReports.Load(), LoadErrs: c.loadErrs.Load(),
		Reconnects: c.reconnects.Load(),
		Queries:    c.queries.Load(), QueryErrs: c.queryErrs.Load(), Restored: c.restored.Load(),
		Recovered: c.recovered.Load(), EventGaps: c.eventGaps.Load(), LostEvents: c.lostEvents.Load(),
		StaleEvents: c.staleEvents.Load(), Abandoned: c.abandoned.Load(),
	}
}

// source is what the core knows of where a message came from: the
// worker's capacities, for load reports.
type source struct {
	capacity, blockSize           int
	maxRequests, maxBatchedTokens int
	recovery                      *RecoveryTarget
}

func sourceOf(p *Publisher) source {
	return source{capacity: p.KVCapacityBlocks, blockSize: p.BlockSize,
		maxRequests: p.MaxRequests, maxBatchedTokens: p.MaxBatchedTokens, recovery: p.Recovery}
}

// pubState is one publisher's sequence state.
type pubState struct {
	last    uint64
	session uint64                         // the connection its last message came over
	workers map[kvroute.WorkerKey]struct{} // workers its kv-events named
	loaded  map[kvroute.WorkerKey]struct{} // workers its load reports named
}

// workerLoad is a worker's latest load reports.
type workerLoad struct {
	active     ActiveLoad
	pass       ForwardPassMetrics
	haveActive bool
	havePass   bool
}

// core is the transport-independent part of a subscriber: sequence
// checks, decoding, numbering and applying. It is owned by one goroutine.
type core struct {
	sink   kvevents.Sink
	load   LoadReporter
	log    *slog.Logger
	stats  *counters
	starts *dpStarts // the subscriber's start ranks, read per event

	// Recovery queries run on goroutines of their own (wg), bounded by
	// ctx, and hand their answers back on results; the owner of the core
	// calls answered with each.
	ctx       context.Context
	querier   *Querier
	giveUp    time.Duration
	wg        sync.WaitGroup
	results   chan queryResult
	lastQuery uint64

	pubs  map[uint64]*pubState
	ids   map[kvroute.WorkerKey]uint64 // last event ID given to the sink per worker
	recs  map[kvroute.WorkerKey]*recovery
	loads map[kvroute.WorkerKey]*workerLoad
	devs  []kvevents.DynamoEvent
	ev    kvroute.Event
}

func newCore(ctx context.Context, sink kvevents.Sink, load LoadReporter, querier *Querier, giveUp time.Duration, log *slog.Logger, stats *counters, starts *dpStarts) *core {
	if giveUp <= 0 {
		giveUp = DefaultRecoveryGiveUp
	}
	return &core{
		ctx: ctx, sink: sink, load: load, querier: querier, giveUp: giveUp, log: log, stats: stats, starts: starts,
		results: make(chan queryResult, 16),
		pubs:    make(map[uint64]*pubState),
		ids:     make(map[kvroute.WorkerKey]uint64),
		recs:    make(map[kvroute.WorkerKey]*recovery),
		loads:   make(map[kvroute.WorkerKey]*workerLoad),
	}
}

// handle processes one envelope received on topic over the connection
// numbered session.
func (c *core) handle(topic string, e *Envelope, src source, session uint64) {
	if !c.sequence(e, session) {
		return
	}
	switch topic {
	case TopicKVEvents:
		c.kvEvents(e, src)
	case TopicKVMetrics, TopicForwardPassMetrics:
		c.loadReport(topic, e, src)
	default:
		c.stats.skipped.Add(1)
	}
}

// sequence checks e's sequence number, received over the connection
// numbered session, against its publisher's and reports whether to
// process it. A sequence that goes back is a restart when it is 0 or
// comes over a new connection (a publisher sends a message once on a
// connection, and a restarted one's first messages are often lost before
// the subscriber reconnects), and a duplicate otherwise.
func (c *core) sequence(e *Envelope, session uint64) bool {
	p := c.pubs[e.PublisherID]
	switch {
	case p == nil:
		// A publisher seen for the first time: what it published before
		// is not ours to know (see Subscriber).
		c.pubs[e.PublisherID] = &pubState{
			last:    e.Sequence,
			session: session,
			workers: make(map[kvroute.WorkerKey]struct{}),
			loaded:  make(map[kvroute.WorkerKey]struct{}),
		}
		if e.Sequence != 0 {
			c.log.Debug("dynamo: joined a publisher mid-stream", "publisher", e.PublisherID, "seq", e.Sequence)
		}
		return true
	case e.Sequence == p.last+1:
	case e.Sequence > p.last:
		lost := e.Sequence - p.last - 1
		c.stats.gaps.Add(1)
		c.stats.lost.Add(lost)
		c.log.Warn("dynamo: sequence gap", "publisher", e.PublisherID, "topic", e.Topic,
			"want", p.last+1, "got", e.Sequence, "lost", lost)
	case e.Sequence == 0 || session != p.session:
		// Sequences only grow: the publisher counts from 0 again.
		c.stats.restarts.Add(1)
		c.log.Info("dynamo: publisher restarted", "publisher", e.PublisherID, "last", p.last, "seq", e.Sequence)
		for w := range p.workers {
			c.resetWorker(w)
			if r := c.recs[w]; r != nil {
				r.restart()
			}
		}
	default:
		c.stats.duplicates.Add(1)
		return false
	}
	p.last, p.session = e.Sequence, session
	return true
}

func (c *core) resetWorker(w kvroute.WorkerKey) {
	c.stats.resets.Add(1)
	c.sink.ResetWorker(w)
	c.ids[w] = 0
}

func (c *core) kvEvents(e *Envelope, src source) {
	if c.sink == nil {
		c.stats.skipped.Add(1)
		return
	}
	var err error
	c.devs, err = DecodeRouterEvents(c.devs[:0], e.Payload)
	if err != nil {
		c.stats.malformed.Add(1)
		c.log.Warn("dynamo: skipping malformed kv-events payload", "publisher", e.PublisherID, "seq", e.Sequence, "err", err)
		return
	}
	p := c.pubs[e.PublisherID]
	for i := range c.devs {
		d := &c.devs[i]
		w, ok := c.starts.key(d.WorkerID, d.DPRank)
		if !ok {
			c.badRank("kv-events", e.PublisherID, d.WorkerID, d.DPRank)
			continue
		}
		p.workers[w] = struct{}{}
		if t := src.recovery; t != nil && t.WorkerID == d.WorkerID && t.DPRank == d.DPRank {
			c.live(c.recoveryOf(w, t), d)
			continue
		}
		c.apply(d)
	}
}

// Recovery timing: a failed query is retried as a dump in the
// background, after recoveryBackoff doubling up to maxRecoveryBackoff,
// until the subscriber's give-up time has passed since the first failure.
// Up to maxKept events of a worker wait for (or are kept during) a query.
const (
	recoveryBackoff    = 500 * time.Millisecond
	maxRecoveryBackoff = 10 * time.Second
	maxKept            = 1 << 14
)

// recovery is the recovery state of a worker whose publisher has a
// recovery target. It is owned by the core's goroutine.
type recovery struct {
	key    kvroute.WorkerKey
	target RecoveryTarget
	// cursor is the last event id applied, when known.
	cursor uint64
	known  bool
	// query is the id of the query under way (0: none): a dump, or the
	// events [from, upto] of a gap.
	query      uint64
	dump       bool
	from, upto uint64
	// hold makes the worker's live events wait in held until the query
	// answers (a first attempt); otherwise (a retry in the background)
	// they are applied and copies kept, to be applied again after the
	// dump.
	hold bool
	held []kvevents.DynamoEvent
	kept []kvevents.DynamoEvent
	// failing is when the current run of failed queries began (zero
	// after a success), backoff the wait before the next retry, gaveUp
	// whether the retries were given up.
	failing time.Time
	backoff time.Duration
	gaveUp  bool
}

// restart forgets what r knew of its worker's event ids, for a worker
// whose engine restarted: it numbers its events from 1 again, and its
// first live event asks for a dump. An answer to a query under way is
// ignored when it comes.
func (r *recovery) restart() {
	r.known, r.cursor, r.query, r.dump, r.hold = false, 0, 0, false, false
	r.held, r.kept = r.held[:0], r.kept[:0]
	r.failing, r.backoff, r.gaveUp = time.Time{}, 0, false
}

// queryResult is a query's answer, handed back to the core's goroutine.
type queryResult struct {
	key  kvroute.WorkerKey
	id   uint64
	resp *QueryResponse
	err  error
}

// recoveryOf returns worker w's recovery state, created for target t.
func (c *core) recoveryOf(w kvroute.WorkerKey, t *RecoveryTarget) *recovery {
	r := c.recs[w]
	if r == nil {
		r = &recovery{key: w, target: *t}
		c.recs[w] = r
	}
	return r
}

// added is called when a publisher is added: with a recovery target, the
// worker's cache is asked for at once, so that a worker that publishes
// nothing for a while is known from the start.
func (c *core) added(src source) {
	t := src.recovery
	if t == nil || c.sink == nil {
		return
	}
	w, ok := c.starts.key(t.WorkerID, t.DPRank)
	if !ok {
		c.log.Warn("dynamo: recovery target's dp rank is below its worker's start rank", "worker", t.WorkerID, "dp_rank", t.DPRank)
		return
	}
	r := c.recoveryOf(w, t)
	if !r.known && r.query == 0 && !r.gaveUp {
		c.startQuery(r, nil, nil, true, 0)
	}
}

// live handles a live event of a worker with a recovery target, in order:
// it waits behind a query under way that holds the worker's events, or
// goes through step.
func (c *core) live(r *recovery, d *kvevents.DynamoEvent) {
	if !r.hold {
		c.step(r, d)
		return
	}
	if len(r.held) < maxKept {
		r.held = append(r.held, cloneEvent(d))
		return
	}
	// Too many events waiting: stop waiting for the query, apply them as
	// without it, and retry in the background.
	c.stats.queryErrs.Add(1)
	c.log.Warn("dynamo: worker KV query outrun by live events", "worker", r.key.String())
	c.settle(r, &queryResult{key: r.key, id: r.query, err: fmt.Errorf("%w: %d events waiting", ErrQuery, len(r.held))})
	c.live(r, d)
}

// step keeps worker r's event-id cursor, as Dynamo's router does, and
// applies d or starts a query: on first sight of the worker it asks for a
// dump of its whole cache, on a jump in event ids for the missing events,
// holding the worker's events until the answer; it skips events a
// recovery already applied.
func (c *core) step(r *recovery, d *kvevents.DynamoEvent) {
	canQuery := r.query == 0 && !r.gaveUp
	switch {
	case d.Kind == kvevents.DynamoCleared:
		// A clear is a barrier: what came before it no longer matters.
	case !r.known:
		if canQuery {
			c.startQuery(r, nil, d, true, 0)
			return
		}
	case d.EventID <= r.cursor:
		c.stats.staleEvents.Add(1)
		return
	case d.EventID > r.cursor+1:
		c.stats.eventGaps.Add(1)
		if canQuery {
			from := r.cursor + 1
			c.startQuery(r, &from, d, true, 0)
			return
		}
		if r.query == 0 {
			c.stats.lostEvents.Add(d.EventID - r.cursor - 1)
		} // else the dump under way covers them
	}
	r.cursor, r.known = d.EventID, true
	c.apply(d)
	if r.query != 0 {
		if len(r.kept) == maxKept {
			// The oldest are the likeliest to be in the dump; should
			// they not be, their loss shows as a gap after it.
			r.kept = append(r.kept[:0], r.kept[maxKept/2:]...)
		}
		r.kept = append(r.kept, cloneEvent(d))
	}
}

// startQuery starts a query for worker r: a dump (from nil) or the events
// from *from up to d's. With hold, d and the worker's next live events
// wait for the answer. The query runs on its own goroutine after delay;
// its answer comes back through c.results.
func (c *core) startQuery(r *recovery, from *uint64, d *kvevents.DynamoEvent, hold bool, delay time.Duration) {
	c.lastQuery++
	r.query, r.dump, r.hold = c.lastQuery, from == nil, hold
	r.held, r.kept = r.held[:0], r.kept[:0]
	var start *uint64
	if from != nil {
		r.from, r.upto = *from, d.EventID-1
		v := *from
		start = &v
	}
	if d != nil {
		r.held = append(r.held, cloneEvent(d))
	}
	res := queryResult{key: r.key, id: r.query}
	t := r.target
	c.wg.Go(func() {
		if delay > 0 {
			timer := time.NewTimer(delay)
			defer timer.Stop()
			select {
			case <-c.ctx.Done():
				return
			case <-timer.C:
			}
		}
		c.stats.queries.Add(1)
		res.resp, res.err = c.querier.Query(c.ctx, t, start, nil)
		select {
		case c.results <- res:
		case <-c.ctx.Done():
		}
	})
}

// answered applies a query's answer, if its worker still waits for it,
// then the worker's events that waited or were kept.
func (c *core) answered(res *queryResult) {
	r := c.recs[res.key]
	if r == nil || r.query != res.id {
		return // the worker was removed, or stopped waiting
	}
	c.settle(r, res)
}

func (c *core) settle(r *recovery, res *queryResult) {
	pending := r.held
	if !r.hold {
		pending = r.kept
	}
	r.held, r.kept, r.query, r.hold = nil, nil, 0, false
	resp, err := res.resp, res.err
	want := "Events"
	if r.dump {
		want = "TreeDump"
		if err == nil && resp.Kind == want {
			err = checkResetScope(resp.ResetScope)
		}
	}
	switch {
	case err == nil && resp.Kind == want && r.dump:
		r.failing, r.backoff = time.Time{}, 0
		c.resetWorker(r.key)
		for i := range resp.Events {
			c.apply(&resp.Events[i])
		}
		c.stats.restored.Add(1)
		c.stats.recovered.Add(uint64(len(resp.Events)))
		r.cursor, r.known = resp.LastEventID, true
	case err == nil && resp.Kind == want:
		r.failing, r.backoff = time.Time{}, 0
		n := uint64(0)
		for i := range resp.Events {
			if e := &resp.Events[i]; e.EventID >= r.from && e.EventID <= r.upto {
				c.apply(e)
				n++
			}
		}
		c.stats.recovered.Add(n)
		if want := r.upto - r.from + 1; n < want {
			c.stats.lostEvents.Add(want - n)
		}
		r.cursor = r.upto
	default:
		c.recoveryFailed(r.key, resp, err)
		if !r.dump {
			c.stats.lostEvents.Add(r.upto - r.from + 1)
			r.cursor = r.upto
		}
		if errors.Is(err, ErrResetScope) {
			// Asking again gets the same answer.
			c.abandon(r, 0)
			break
		}
		c.retry(r)
	}
	for i := range pending {
		c.live(r, &pending[i])
	}
}

// retry schedules a background dump of worker r after a failed query, or
// gives up when its queries have failed for longer than c.giveUp: the
// worker's events are then applied as without recovery until its
// publisher is added again.
func (c *core) retry(r *recovery) {
	now := time.Now()
	if r.failing.IsZero() {
		r.failing = now
	}
	if now.Sub(r.failing) >= c.giveUp {
		c.abandon(r, now.Sub(r.failing))
		return
	}
	r.backoff = min(max(2*r.backoff, recoveryBackoff), maxRecoveryBackoff)
	c.startQuery(r, nil, nil, false, r.backoff)
}

// abandon gives up recovering worker r: its events are applied as
// without recovery until its publisher is added again.
func (c *core) abandon(r *recovery, failingFor time.Duration) {
	r.gaveUp = true
	c.stats.abandoned.Add(1)
	c.log.Warn("dynamo: giving up recovering a worker", "worker", r.key.String(), "failing_for", failingFor)
}

// badRank counts and logs an event or report whose rank is below its
// worker's start rank.
func (c *core) badRank(topic string, publisher, worker uint64, rank uint32) {
	c.stats.malformed.Add(1)
	c.log.Warn("dynamo: skipping a report of a dp rank below its worker's start rank", "topic", topic,
		"publisher", publisher, "worker", worker, "dp_rank", rank, "start_rank", c.starts.get(worker))
}

// cloneEvent copies d and the slices it holds.
func cloneEvent(d *kvevents.DynamoEvent) kvevents.DynamoEvent {
	out := *d
	out.Blocks = slices.Clone(d.Blocks)
	for i := range out.Blocks {
		mm := slices.Clone(out.Blocks[i].MMObjects)
		for j := range mm {
			mm[j].Offsets = slices.Clone(mm[j].Offsets)
		}
		out.Blocks[i].MMObjects = mm
	}
	out.Removed = slices.Clone(d.Removed)
	return out
}

func (c *core) recoveryFailed(w kvroute.WorkerKey, resp *QueryResponse, err error) {
	c.stats.queryErrs.Add(1)
	kind := ""
	if resp != nil {
		kind = resp.Kind
	}
	c.log.Warn("dynamo: worker KV query failed", "worker", w.String(), "response", kind, "err", err)
}

// apply converts d, numbers it for its worker and applies it to the sink.
func (c *core) apply(d *kvevents.DynamoEvent) {
	ev := &c.ev
	if err := d.ToEvent(ev); err != nil {
		if errors.Is(err, kvevents.ErrOtherResidency) {
			c.stats.otherResidency.Add(1)
		} else {
			c.stats.malformed.Add(1)
		}
		return
	}
	w, ok := c.starts.key(d.WorkerID, d.DPRank)
	if !ok {
		// An event of a recovery answer (live events were checked).
		c.badRank("kv-events", 0, d.WorkerID, d.DPRank)
		return
	}
	ev.Worker = w
	last, known := c.ids[w]
	if !known {
		// A worker this subscriber has not numbered yet: the sink must
		// forget any earlier sequence of it.
		c.resetWorker(w)
	}
	ev.ID = last + 1
	c.ids[w] = ev.ID
	if err := c.sink.Apply(ev); err != nil {
		c.stats.applyErrs.Add(1)
		if errors.Is(err, indexer.ErrUnknownParent) {
			c.stats.unknownParents.Add(1)
		}
		c.log.Debug("dynamo: sink rejected event", "event", ev.String(), "err", err)
		return
	}
	c.stats.applied.Add(1)
	switch ev.Kind {
	case kvroute.EventStored:
		c.stats.stored.Add(1)
	case kvroute.EventRemoved:
		c.stats.removed.Add(1)
	case kvroute.EventCleared:
		c.stats.cleared.Add(1)
	}
}

func (c *core) loadReport(topic string, e *Envelope, src source) {
	if c.load == nil {
		c.stats.skipped.Add(1)
		return
	}
	var (
		w   kvroute.WorkerKey
		ok  bool
		err error
		al  ActiveLoad
		fpm ForwardPassMetrics
	)
	if topic == TopicKVMetrics {
		err = DecodeActiveLoad(e.Payload, &al)
		w = al.Worker()
	} else {
		err = DecodeForwardPassMetrics(e.Payload, &fpm)
		w = fpm.Worker()
	}
	if err != nil {
		c.stats.malformed.Add(1)
		c.log.Warn("dynamo: skipping malformed load report", "topic", topic, "publisher", e.PublisherID, "err", err)
		return
	}
	abs := w
	if w, ok = c.starts.key(uint64(abs.ID), uint32(abs.Rank)); !ok {
		c.badRank(topic, e.PublisherID, uint64(abs.ID), uint32(abs.Rank))
		return
	}
	c.pubs[e.PublisherID].loaded[w] = struct{}{}
	wl := c.loads[w]
	if wl == nil {
		wl = &workerLoad{}
		c.loads[w] = wl
	}
	if topic == TopicKVMetrics {
		wl.active, wl.haveActive = al, true
	} else {
		wl.pass, wl.havePass = fpm, true
	}
	var ap *ActiveLoad
	var fp *ForwardPassMetrics
	if wl.haveActive {
		ap = &wl.active
	}
	if wl.havePass {
		fp = &wl.pass
	}
	c.stats.loadReports.Add(1)
	load := LoadOf(ap, fp, src.capacity, src.blockSize)
	load.MaxRequests, load.MaxBatchedTokens = src.maxRequests, src.maxBatchedTokens
	if err := c.load.Heartbeat(w, load); err != nil {
		c.stats.loadErrs.Add(1)
		c.log.Debug("dynamo: load report refused", "worker", w.String(), "err", err)
	}
}

// forget drops the state of publishers whose endpoint was removed (their
// sequences and the load reports they made) and the recovery state of the
// worker src recovers (its events waiting for a query are dropped, the
// answer of a query under way ignored), so that they start afresh if they
// come back.
func (c *core) forget(ids map[uint64]struct{}, src source) {
	if t := src.recovery; t != nil {
		for w, r := range c.recs {
			if r.target == *t {
				delete(c.recs, w)
			}
		}
	}
	for id := range ids {
		if p := c.pubs[id]; p != nil {
			for w := range p.loaded {
				delete(c.loads, w)
			}
		}
		delete(c.pubs, id)
	}
}
