package dynamo

import (
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
}

// counters are Stats as atomics.
type counters struct {
	received, malformed, skipped, gaps, lost, duplicates, restarts atomic.Uint64
	applied, stored, removed, cleared, applyErrs, unknownParents   atomic.Uint64
	resets, loadReports, loadErrs, reconnects                      atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Received: c.received.Load(), Malformed: c.malformed.Load(), Skipped: c.skipped.Load(),
		Gaps: c.gaps.Load(), Lost: c.lost.Load(), Duplicates: c.duplicates.Load(), Restarts: c.restarts.Load(),
		Applied: c.applied.Load(), AppliedStored: c.stored.Load(), AppliedRemoved: c.removed.Load(),
		AppliedCleared: c.cleared.Load(), ApplyErrs: c.applyErrs.Load(), UnknownParents: c.unknownParents.Load(),
		Resets: c.resets.Load(), LoadReports: c.loadReports.Load(), LoadErrs: c.loadErrs.Load(),
		Reconnects: c.reconnects.Load(),
	}
}

// source is what the core knows of where a message came from: the
// worker's capacities, for load reports.
type source struct {
	capacity, blockSize           int
	maxRequests, maxBatchedTokens int
}

func sourceOf(p Publisher) source {
	return source{capacity: p.KVCapacityBlocks, blockSize: p.BlockSize,
		maxRequests: p.MaxRequests, maxBatchedTokens: p.MaxBatchedTokens}
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

	pubs  map[uint64]*pubState
	ids   map[kvroute.WorkerKey]uint64 // last event ID per worker
	loads map[kvroute.WorkerKey]*workerLoad
	devs  []kvevents.DynamoEvent
	ev    kvroute.Event
}

func newCore(sink kvevents.Sink, load LoadReporter, log *slog.Logger, stats *counters) *core {
	return &core{
		sink: sink, load: load, log: log, stats: stats,
		pubs:  make(map[uint64]*pubState),
		ids:   make(map[kvroute.WorkerKey]uint64),
		loads: make(map[kvroute.WorkerKey]*workerLoad),
	}
}

// handle processes one envelope received on topic.
func (c *core) handle(topic string, e *Envelope, src source) {
	if !c.sequence(e) {
		return
	}
	switch topic {
	case TopicKVEvents:
		c.kvEvents(e)
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

func (c *core) kvEvents(e *Envelope) {
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
		ev := &c.ev
		if err := c.devs[i].ToEvent(ev); err != nil {
			c.stats.malformed.Add(1)
			continue
		}
		w := ev.Worker
		p.workers[w] = struct{}{}
		last, known := c.ids[w]
		if !known {
			// A worker this subscriber has not numbered yet: the sink
			// must forget any earlier sequence of it.
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
			continue
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
