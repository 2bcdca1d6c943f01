package dynamo

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
)

// Stats counts what a subscriber did. All fields only grow.
type Stats struct {
	// Received are messages received, of every topic.
	Received uint64
	// Malformed are messages (or payloads) that did not decode, skipped
	// without touching the index: the blocks a skipped kv-events message
	// stored are missing until the engine stores them again, and those it
	// removed stay indexed until removed or cleared again.
	Malformed uint64
	// Skipped are messages of topics the subscriber does not read
	// (active_sequences_events, or load topics without Config.Load).
	Skipped uint64
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
}

// counters are Stats as atomics.
type counters struct {
	received, malformed, skipped, gaps, lost, duplicates, restarts atomic.Uint64
	applied, stored, removed, cleared, applyErrs, unknownParents   atomic.Uint64
	resets, loadReports, loadErrs, reconnects                      atomic.Uint64
	queries, queryErrs, restored, recovered, eventGaps             atomic.Uint64
	lostEvents, staleEvents                                        atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Received: c.received.Load(), Malformed: c.malformed.Load(), Skipped: c.skipped.Load(),
		Gaps: c.gaps.Load(), Lost: c.lost.Load(), Duplicates: c.duplicates.Load(), Restarts: c.restarts.Load(),
		Applied: c.applied.Load(), AppliedStored: c.stored.Load(), AppliedRemoved: c.removed.Load(),
		AppliedCleared: c.cleared.Load(), ApplyErrs: c.applyErrs.Load(), UnknownParents: c.unknownParents.Load(),
		Resets: c.resets.Load(), LoadReports: c.loadReports.Load(), LoadErrs: c.loadErrs.Load(),
		Reconnects: c.reconnects.Load(),
		Queries:    c.queries.Load(), QueryErrs: c.queryErrs.Load(), Restored: c.restored.Load(),
		Recovered: c.recovered.Load(), EventGaps: c.eventGaps.Load(), LostEvents: c.lostEvents.Load(),
		StaleEvents: c.staleEvents.Load(),
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
	sink  kvevents.Sink
	load  LoadReporter
	log   *slog.Logger
	stats *counters

	ctx     context.Context // bounds recovery queries
	querier *Querier

	pubs    map[uint64]*pubState
	ids     map[kvroute.WorkerKey]uint64 // last event ID given to the sink per worker
	cursors map[kvroute.WorkerKey]uint64 // last Dynamo event_id per worker with a recovery target
	loads   map[kvroute.WorkerKey]*workerLoad
	devs    []kvevents.DynamoEvent
	ev      kvroute.Event
}

func newCore(ctx context.Context, sink kvevents.Sink, load LoadReporter, querier *Querier, log *slog.Logger, stats *counters) *core {
	return &core{
		ctx: ctx, sink: sink, load: load, querier: querier, log: log, stats: stats,
		pubs:    make(map[uint64]*pubState),
		ids:     make(map[kvroute.WorkerKey]uint64),
		cursors: make(map[kvroute.WorkerKey]uint64),
		loads:   make(map[kvroute.WorkerKey]*workerLoad),
	}
}

// handle processes one envelope received on topic.
func (c *core) handle(topic string, e *Envelope, src source) {
	if !c.sequence(e) {
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

// sequence checks e's sequence number against its publisher's and reports
// whether to process it.
func (c *core) sequence(e *Envelope) bool {
	p := c.pubs[e.PublisherID]
	switch {
	case p == nil:
		// A publisher seen for the first time: what it published before
		// is not ours to know (see Subscriber).
		c.pubs[e.PublisherID] = &pubState{
			last:    e.Sequence,
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
	case e.Sequence == 0:
		// Sequences only grow: the publisher counts from 0 again.
		c.stats.restarts.Add(1)
		c.log.Info("dynamo: publisher restarted", "publisher", e.PublisherID, "last", p.last)
		for w := range p.workers {
			c.resetWorker(w)
		}
	default:
		c.stats.duplicates.Add(1)
		return false
	}
	p.last = e.Sequence
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
		w := kvroute.WorkerKey{ID: kvroute.WorkerID(d.WorkerID), Rank: kvroute.DPRank(d.DPRank)}
		p.workers[w] = struct{}{}
		if t := src.recovery; t != nil && t.WorkerID == d.WorkerID && t.DPRank == d.DPRank && !c.recover(w, d, t) {
			continue // already applied, from a recovery
		}
		c.apply(d)
	}
}

// recover keeps worker w's event-id cursor, as Dynamo's router does, and
// reports whether live event d is to be applied: on first sight of the
// worker it restores the worker's whole cache from its local indexer (a
// dump), on a jump in event ids it fetches the missing events, and it
// skips events the recovery already applied.
func (c *core) recover(w kvroute.WorkerKey, d *kvevents.DynamoEvent, t *RecoveryTarget) bool {
	cur, known := c.cursors[w]
	if d.Kind == kvevents.DynamoCleared {
		// A clear is a barrier: what came before it no longer matters.
		c.cursors[w] = d.EventID
		return true
	}
	switch {
	case !known:
		resp, err := c.query(t, nil)
		if err != nil || resp.Kind != "TreeDump" {
			c.recoveryFailed(w, resp, err)
			c.cursors[w] = d.EventID
			return true
		}
		c.resetWorker(w)
		for i := range resp.Events {
			c.apply(&resp.Events[i])
		}
		c.stats.restored.Add(1)
		c.stats.recovered.Add(uint64(len(resp.Events)))
		c.cursors[w] = resp.LastEventID
		cur = resp.LastEventID
		if d.EventID <= cur {
			c.stats.staleEvents.Add(1)
			return false // in the dump
		}
		if d.EventID == cur+1 {
			c.cursors[w] = d.EventID
			return true
		}
		fallthrough
	case d.EventID > cur+1:
		from := cur + 1
		c.stats.eventGaps.Add(1)
		resp, err := c.query(t, &from)
		if err != nil || resp.Kind != "Events" {
			c.recoveryFailed(w, resp, err)
			c.stats.lostEvents.Add(d.EventID - from)
		} else {
			n := uint64(0)
			for i := range resp.Events {
				r := &resp.Events[i]
				if r.EventID >= from && r.EventID < d.EventID {
					c.apply(r)
					n++
				}
			}
			c.stats.recovered.Add(n)
			if want := d.EventID - from; n < want {
				c.stats.lostEvents.Add(want - n)
			}
		}
	case d.EventID <= cur:
		c.stats.staleEvents.Add(1)
		return false
	}
	c.cursors[w] = d.EventID
	return true
}

func (c *core) query(t *RecoveryTarget, start *uint64) (*QueryResponse, error) {
	c.stats.queries.Add(1)
	return c.querier.Query(c.ctx, *t, start, nil)
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
		c.stats.malformed.Add(1)
		return
	}
	w := ev.Worker
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
// sequences and the load reports they made), so that they start afresh if
// they come back.
func (c *core) forget(ids map[uint64]struct{}) {
	for id := range ids {
		if p := c.pubs[id]; p != nil {
			for w := range p.loaded {
				delete(c.loads, w)
			}
		}
		delete(c.pubs, id)
	}
}
