package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v3"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/scheduling"
)

// Errors returned by the router. Errors from Select wrap one of these or a
// scheduling error (scheduling.ErrAllBusy, scheduling.ErrQueueFull, a
// context error).
var (
	// ErrInvalidConfig: a Config or Worker value is out of range.
	ErrInvalidConfig = errors.New("router: invalid configuration")
	// ErrNoWorkers: no healthy worker can serve the request (none added,
	// all unhealthy, or none with the role the request needs). Retry after
	// workers recover.
	ErrNoWorkers = errors.New("router: no eligible worker")
	// ErrUnknownWorker: the worker id is not registered.
	ErrUnknownWorker = errors.New("router: unknown worker")
	// ErrDuplicateWorker: AddWorker was given an id already registered.
	ErrDuplicateWorker = errors.New("router: worker already registered")
	// ErrPinnedUnavailable: the request is pinned to a worker that is not
	// registered, not healthy or busy. The caller may retry unpinned.
	ErrPinnedUnavailable = errors.New("router: pinned worker unavailable")
	// ErrNoVerdict, wrapped in an Outcome's Err, ends a request whose end
	// says nothing of the worker's health either way: the worker turned
	// it away as overloaded (HTTP 429) or judged the request itself
	// invalid (HTTP 4xx). It neither counts against the worker nor clears
	// its errors (see Outcome).
	ErrNoVerdict = errors.New("router: no verdict on the worker")
)

// MaxDataParallelRanks bounds Worker.DataParallelRanks.
const MaxDataParallelRanks = 1 << 12

// Config configures a Router. The zero value routes aggregated workers
// with block size 16 by kvroute's default cost (scheduling.NewDefaultCost:
// cache affinity with a charge for the KV held in flight, under a bound on
// each worker's share of the load), counting the load of the requests it
// routed itself and taking only capacities from engines' load reports
// (LoadReportCapacities), exact index, no queue.
type Config struct {
	// Hasher hashes prompts; its block size must match the workers'. Zero
	// means kvroute.DefaultBlockSize.
	Hasher kvroute.Hasher
	// Index is the exact prefix index that the host feeds with the
	// engines' KV events. Nil means the router makes one (Router.Index
	// returns it). Ignored when Approximate is set.
	Index *indexer.Index
	// Approximate makes the router record its own decisions in an
	// approximate index instead, for engines that publish no KV events.
	Approximate bool
	// ApproxConfig configures the approximate index (TTL, size bound).
	ApproxConfig indexer.ApproxConfig
	// Cost scores candidates (lower is better). Nil means kvroute's
	// default, scheduling.NewDefaultCost: Dynamo's cost weighted towards
	// the cache (overlap weight 2, prefill load scale 16, 16 blocks per
	// active request) plus 8,000 blocks for a worker's whole KV cache held
	// in flight, with no worker above twice its fair share of the requests
	// in flight. For NVIDIA Dynamo's own default, pass
	// scheduling.NewDynamoCost with the zero config. When it is a
	// *scheduling.StalenessCost, candidates carry the time of their last
	// KV event (indexer.Index.LastUpdate).
	Cost scheduling.CostFunc
	// DecodeCost scores decode workers in disaggregated serving. Nil means
	// Dynamo's cost with overlap weight 0 (decode load only).
	DecodeCost scheduling.CostFunc
	// Selector configures the choice among costs (temperature, seed).
	Selector scheduling.SelectorConfig
	// Busy marks workers too loaded to be candidates.
	Busy scheduling.BusyThresholds
	// Queue, when set, enables the admission queue: requests wait while
	// every eligible worker is saturated with prefill work.
	Queue *scheduling.QueueConfig
	// LoadReports says how the engines' load reports (Heartbeat) combine
	// with the load the router tracks itself. The zero value,
	// LoadReportCapacities, takes only capacities from a report and counts
	// requests, prefill tokens and KV blocks in flight from the requests
	// the router routed: right when this router sends all the traffic its
	// workers get, or when its replicas share their requests through
	// LoadTracker and LoadSync. A report lags the engine (an idle Dynamo
	// engine reports about once a second), and its counts would keep a
	// worker that has just finished looking busy. LoadReportMerged takes
	// the larger of the engine's and the router's counts: right when other
	// routers, or clients, send traffic to the same workers, which only
	// the engines' reports show.
	LoadReports LoadReportMode
	// Tracker configures the active-request load tracker (request TTL).
	Tracker scheduling.TrackerConfig
	// LoadTracker, when set, is the tracker the router uses instead of
	// making one from Tracker: a tracker it shares with a LoadSync that
	// adds other replicas' requests to it (kvevents/natsx.Replica). Its
	// block size must be the hasher's.
	LoadTracker *scheduling.Tracker
	// LoadSync, when set, receives the load of every request this router
	// routes, to share it with other router replicas (see LoadSync).
	LoadSync LoadSync
	// Health configures heartbeat and error based health.
	Health HealthConfig
	// RemoveGrace, when positive, is how long RemoveWorker leaves a
	// removed worker's blocks in the index. The worker leaves routing and
	// its tracked requests are dropped at once, but the blocks stay, and
	// KV events for it go on being applied, so that a worker added again
	// within the grace (an engine that re-registers after a network blip or
	// a restart of its discovery, keeping its cache) is routed to with
	// its cache known. Once the grace has passed without the worker coming
	// back, its blocks leave the index: at the next CheckHealth, AddWorker,
	// UpdateWorker, RemoveWorker or PurgeWorker. PurgeWorker removes a
	// worker and its blocks at once.
	//
	// Set it when the index is fed by a stream that does not stop with the
	// worker's registration, as with kvevents/natsx.Replica, whose relay
	// goes on publishing the engine's events: without it, a worker removed
	// and added again while its engine keeps its cache has an empty index
	// entry that no event repairs, because the engine does not announce
	// blocks it already holds. Zero means RemoveWorker clears the blocks at
	// once.
	RemoveGrace time.Duration
	// SessionTTL is how long a session affinity key keeps sending its
	// requests to the same worker after its last request. Zero means
	// 10 minutes.
	SessionTTL time.Duration
	// FeedbackWindow is the number of recent outcomes routing accuracy is
	// computed over. Zero means 1,000.
	FeedbackWindow int
	// Clock supplies time to health, sessions, the tracker and the queue.
	// Nil means the system clock.
	Clock kvroute.Clock
	// Logger receives health changes at info level and, at debug level,
	// every decision's candidates with their overlap and cost. Nil
	// discards.
	Logger *slog.Logger
}

// LoadReportMode is how a Router combines engines' load reports with the
// load it tracks itself (Config.LoadReports).
type LoadReportMode uint8

// The load report modes.
const (
	// LoadReportCapacities takes only the capacities of a report (KV
	// capacity blocks, request slots, batch token budget, prefill
	// throughput; a zero one leaves the Worker's own); the active
	// requests, prefill tokens and KV blocks come from the router's
	// tracker alone, and the engine's queue depth and KV utilisation are
	// not used in routing. Router.Stats still shows the whole report.
	LoadReportCapacities LoadReportMode = iota
	// LoadReportMerged takes the whole report, and for the active
	// requests, prefill tokens and KV blocks the larger of the engine's
	// and the router's counts, so that traffic other routers send is seen.
	LoadReportMerged
)

// String returns the mode's name.
func (m LoadReportMode) String() string {
	switch m {
	case LoadReportCapacities:
		return "capacities"
	case LoadReportMerged:
		return "merged"
	}
	return fmt.Sprintf("LoadReportMode(%d)", uint8(m))
}

// MarshalText returns the mode's name, as String does; it fails for an
// unknown mode.
func (m LoadReportMode) MarshalText() ([]byte, error) {
	if m > LoadReportMerged {
		return nil, fmt.Errorf("%w: %s", ErrInvalidConfig, m)
	}
	return []byte(m.String()), nil
}

// UnmarshalText sets the mode from its name, "capacities" or "merged", so
// that a mode can be read from a flag (flag.TextVar) or a JSON string.
func (m *LoadReportMode) UnmarshalText(text []byte) error {
	switch string(text) {
	case "capacities":
		*m = LoadReportCapacities
	case "merged":
		*m = LoadReportMerged
	default:
		return fmt.Errorf("%w: load report mode %q: want capacities or merged", ErrInvalidConfig, text)
	}
	return nil
}

// Router decides, for each request, which worker serves it.
//
// Concurrency: Select, the Decision methods, Heartbeat, ReportError,
// CheckHealth and Stats are safe for concurrent use. Select reads an
// immutable snapshot of the workers through one atomic pointer and takes
// no lock of the router's own (the tracker and the index lock internally
// per shard and per worker). AddWorker, UpdateWorker, RemoveWorker and
// PurgeWorker serialise on a registry mutex and publish a new snapshot;
// Select calls in flight finish on the snapshot they started with.
type Router struct {
	hasher     kvroute.Hasher
	index      *indexer.Index
	approx     *indexer.Approx
	cost       scheduling.CostFunc
	decodeCost scheduling.CostFunc
	sel        *scheduling.Selector
	busy       scheduling.BusyThresholds
	queue      *scheduling.Queue
	tracker    *scheduling.Tracker
	loadSync   LoadSync
	merge      bool // Config.LoadReports == LoadReportMerged
	health     HealthConfig
	sessionTTL time.Duration
	grace      time.Duration // Config.RemoveGrace
	clock      kvroute.Clock
	log        *slog.Logger
	debug      bool
	staleness  bool // fill Candidate.LastUpdate from the index

	// mu serialises registry changes; it protects workers and the
	// publication of snap.
	mu      sync.Mutex
	workers map[kvroute.WorkerID]*workerEntry
	snap    atomic.Pointer[snapshot]
	// removed holds, per cache domain removed under RemoveGrace, when its
	// blocks leave the index (unix ns). Guarded by mu.
	removed map[kvroute.WorkerKey]int64

	sessions *xsync.MapOf[string, session]
	// nextID is the last tracker id handed out; each scratch takes a block
	// of idBlock ids at a time, so that decisions on different cores do not
	// add to one counter.
	nextID atomic.Uint64
	// scratches counts the scratches made, to spread them over the stripes
	// of stats.
	// approxDue is when the approximate index is next expired, unix ns.
	approxDue atomic.Int64
	scratch   sync.Pool
	scratches atomic.Uint32
	stats     routerStats
	feedback  feedback
}

// workerEntry is a registered worker and its cache domains.
type workerEntry struct {
	w       Worker
	domains []*domain
}

// domain is one cache domain (a worker's data-parallel rank). It is shared
// by successive snapshots. Its description is immutable; its mutable state
// lives in a domainState that UpdateWorker hands on to the domain that
// replaces it, so that a heartbeat or an error recorded on the old domain
// while the worker is being updated is not lost.
type domain struct {
	key    kvroute.WorkerKey
	role   Role
	static scheduling.Load // capacities from the Worker
	*domainState
}

// domainState is the mutable, atomic state of a cache domain.
type domainState struct {
	added int64 // when the domain was first added, unix ns

	reported      atomic.Pointer[scheduling.Load] // last heartbeat report
	lastHeartbeat atomic.Int64                    // unix ns, 0 = never
	// health holds the Health in its low 32 bits and, above them, the
	// number of judgements stored (see Router.rejudge).
	health    atomic.Uint64
	errors    atomic.Int32
	lastError atomic.Int64 // unix ns of the last error, 0 = none
	decisions atomic.Uint64

	// leaving orders the domain's departure (its removal, or its rank
	// dropped by an update) after the approximate-index records of the
	// decisions made for it: a decision records its blocks holding it for
	// reading, and only while left is unset (see recordApprox).
	leaving sync.RWMutex
	left    bool // guarded by leaving
}

// leave marks the domain as gone, once the approximate-index records of
// decisions made for it that are under way have ended; any later one
// records nothing.
func (s *domainState) leave() {
	s.leaving.Lock()
	s.left = true
	s.leaving.Unlock()
}

// snapshot is the immutable worker set Select reads. It is rebuilt when
// workers are added, updated or removed, when a domain's health changes and
// when a domain sends its first load report, all rare events.
type snapshot struct {
	domains []*domain // sorted by key
	byKey   keyIndex  // key → index in domains
	roles   [3]int    // domains per role
	// phases holds, per selection phase, the candidates ready to copy.
	phases [3]phaseSet
	// reported is set when some domain has a load report to merge.
	reported bool
}

// phaseSet is the candidate template of one selection phase: the eligible
// domains with their identity and static capacities filled in, healthy
// ones first, then degraded ones (unhealthy ones are left out).
type phaseSet struct {
	cands   []scheduling.Candidate
	doms    []*domain
	healthy int      // cands[:healthy] are healthy
	pos     keyIndex // key → index in cands
}

type session struct {
	key     kvroute.WorkerKey
	expires int64
}

// New returns a Router with no workers.
func New(cfg Config) (*Router, error) {
	r := &Router{
		hasher:     cfg.Hasher,
		clock:      kvroute.ClockOrSystem(cfg.Clock),
		log:        cfg.Logger,
		busy:       cfg.Busy,
		loadSync:   cfg.LoadSync,
		sessionTTL: cfg.SessionTTL,
		grace:      cfg.RemoveGrace,
		workers:    map[kvroute.WorkerID]*workerEntry{},
		removed:    map[kvroute.WorkerKey]int64{},
		sessions:   xsync.NewMapOf[string, session](),
	}
	if !r.hasher.Valid() {
		if r.hasher != (kvroute.Hasher{}) {
			return nil, fmt.Errorf("%w: invalid hasher", ErrInvalidConfig)
		}
		r.hasher = kvroute.MustHasher(kvroute.HasherConfig{})
	}
	if r.log == nil {
		r.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r.debug = r.log.Handler().Enabled(context.Background(), slog.LevelDebug)
	if r.sessionTTL == 0 {
		r.sessionTTL = 10 * time.Minute
	}
	if r.grace < 0 {
		return nil, fmt.Errorf("%w: negative RemoveGrace %v", ErrInvalidConfig, r.grace)
	}
	if cfg.LoadReports > LoadReportMerged {
		return nil, fmt.Errorf("%w: unknown load report mode %d", ErrInvalidConfig, cfg.LoadReports)
	}
	r.merge = cfg.LoadReports == LoadReportMerged
	var err error
	if r.health, err = cfg.Health.withDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.Busy.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	switch {
	case cfg.Approximate:
		ac := cfg.ApproxConfig
		ac.Index.Hasher = r.hasher
		if ac.Clock == nil {
			ac.Clock = r.clock
		}
		if ac.Index.Clock == nil {
			ac.Index.Clock = r.clock
		}
		if r.approx, err = indexer.NewApprox(ac); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		r.index = r.approx.Index
	case cfg.Index != nil:
		r.index = cfg.Index
	default:
		if r.index, err = indexer.New(indexer.Config{Hasher: r.hasher, Clock: r.clock}); err != nil {
			return nil, err
		}
	}
	r.cost = cfg.Cost
	if r.cost == nil {
		if r.cost, err = scheduling.NewDefaultCost(r.hasher.BlockSize()); err != nil {
			return nil, err
		}
	}
	// A staleness-aware cost needs each candidate's last index update,
	// which costs an index lookup per candidate: only then is it filled.
	_, r.staleness = r.cost.(*scheduling.StalenessCost)
	r.decodeCost = cfg.DecodeCost
	if r.decodeCost == nil {
		if r.decodeCost, err = scheduling.NewDynamoCost(scheduling.DynamoCostConfig{
			BlockSize: r.hasher.BlockSize(), OverlapWeight: scheduling.Float(0)}); err != nil {
			return nil, err
		}
	}
	if r.sel, err = scheduling.NewSelector(cfg.Selector); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	tc := cfg.Tracker
	if tc.BlockSize == 0 {
		tc.BlockSize = r.hasher.BlockSize()
	}
	if tc.Clock == nil {
		tc.Clock = r.clock
	}
	if r.tracker = cfg.LoadTracker; r.tracker == nil {
		if r.tracker, err = scheduling.NewTracker(tc); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	} else if bs := r.tracker.BlockSize(); bs != r.hasher.BlockSize() {
		// Its output blocks would not be the index's blocks.
		return nil, fmt.Errorf("%w: the load tracker counts blocks of %d tokens, the hasher hashes blocks of %d", ErrInvalidConfig, bs, r.hasher.BlockSize())
	}
	if cfg.Queue != nil {
		qc := *cfg.Queue
		if qc.Clock == nil {
			qc.Clock = r.clock
		}
		if r.queue, err = scheduling.NewQueue(qc); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	window := cfg.FeedbackWindow
	if window == 0 {
		window = 1000
	}
	if window < 0 {
		return nil, fmt.Errorf("%w: feedback window %d", ErrInvalidConfig, window)
	}
	r.feedback.ring = make([]bool, window)
	r.snap.Store(&snapshot{})
	r.scratch.New = func() any { return &scratch{stripe: uint8(r.scratches.Add(1) % statStripes)} }
	return r, nil
}

// Index returns the prefix index the router matches against: the exact
// index the host feeds with KV events, or in approximate mode the index
// the router records its decisions in.
func (r *Router) Index() *indexer.Index { return r.index }

// Approximate reports whether the router records its own decisions in an
// approximate index (Config.Approximate) rather than matching an index fed
// by the engines' KV events.
func (r *Router) Approximate() bool { return r.approx != nil }

// Tracker returns the router's active-request load tracker.
func (r *Router) Tracker() *scheduling.Tracker { return r.tracker }

// Hasher returns the hasher the router hashes prompts with.
func (r *Router) Hasher() kvroute.Hasher { return r.hasher }

// AddWorker registers w. It returns ErrDuplicateWorker when its id is
// registered already and ErrInvalidConfig when its block size differs
// from the router's hasher. A worker removed less than RemoveGrace ago
// keeps the blocks the index holds for it.
func (r *Router) AddWorker(w Worker) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.workers[w.ID()]; ok {
		return fmt.Errorf("%w: %d", ErrDuplicateWorker, w.ID())
	}
	e, err := r.newEntry(w, nil)
	if err != nil {
		return err
	}
	r.expireRemovedLocked()
	r.keepDomains(e)
	r.reserve(e, nil)
	r.workers[w.ID()] = e
	r.publish()
	r.releaseAll()
	return nil
}

// reserve makes room in the index for the KV cache of each of e's
// domains whose capacity the worker reports (Capacity), so that the
// index does not rebuild its map of the domain's blocks as the cache
// fills. A domain of old (the entry e replaces, nil for none; its
// domains are e's ranks, as in newEntry) that reported a capacity e no
// longer reports gets its reservation cancelled. r.mu is held.
func (r *Router) reserve(e, old *workerEntry) {
	for rank, d := range e.domains {
		switch c := d.static.KVCapacityBlocks; {
		case c > 0:
			r.index.ReserveWorker(d.key, c)
		case old != nil && rank < len(old.domains) && old.domains[rank].static.KVCapacityBlocks > 0:
			r.index.ReserveWorker(d.key, 0)
		}
	}
}

// UpdateWorker replaces the description of a registered worker (role,
// ranks, capacities), keeping the health, heartbeats and index entries of
// the ranks it still has. Ranks it no longer has are removed as by
// RemoveWorker.
func (r *Router) UpdateWorker(w Worker) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	old, ok := r.workers[w.ID()]
	if !ok {
		return fmt.Errorf("%w: %d", ErrUnknownWorker, w.ID())
	}
	e, err := r.newEntry(w, old)
	if err != nil {
		return err
	}
	r.expireRemovedLocked()
	r.keepDomains(e)
	r.reserve(e, old)
	r.workers[w.ID()] = e
	r.publish() // first, so that no new decision picks a dropped rank
	for _, d := range old.domains[min(len(old.domains), len(e.domains)):] {
		r.dropDomain(d, false)
	}
	r.releaseAll()
	return nil
}

// RemoveWorker unregisters worker id: it is no longer chosen and its
// tracked requests are dropped; its blocks leave the index at once, or,
// with Config.RemoveGrace, when the grace has passed without the worker
// being added again. Decisions already made for it stay valid; their Done
// is harmless. It reports whether the worker was registered.
//
// Without a grace, stop the worker's KV-event subscribers first: an event
// applied to the index after the removal registers its cache domain in the
// index again (not in the router), and its blocks would stay until the
// index is reset.
func (r *Router) RemoveWorker(id kvroute.WorkerID) bool {
	return r.remove(id, false)
}

// PurgeWorker unregisters worker id as RemoveWorker does and removes its
// blocks from the index at once, whatever Config.RemoveGrace says: for a
// worker whose engine is gone for good or was replaced by one with an
// empty cache. It also purges the blocks of a worker removed earlier whose
// grace has not passed. It reports whether the worker was registered or
// still in its grace.
func (r *Router) PurgeWorker(id kvroute.WorkerID) bool {
	return r.remove(id, true)
}

func (r *Router) remove(id kvroute.WorkerID, purge bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expireRemovedLocked()
	found := false
	if purge {
		for k := range r.removed {
			if k.ID == id {
				r.dropIndex(k)
				delete(r.removed, k)
				found = true
			}
		}
	}
	e, ok := r.workers[id]
	if !ok {
		return found
	}
	delete(r.workers, id)
	r.publish()
	for _, d := range e.domains {
		r.dropDomain(d, purge)
	}
	return true
}

// dropDomain drops the tracked requests of a cache domain that left the
// router, and its blocks: at once when now is set or there is no grace,
// else when the grace has passed. Decisions made for it record no more
// blocks in the approximate index. r.mu is held.
func (r *Router) dropDomain(d *domain, now bool) {
	k := d.key
	d.leave()
	r.tracker.RemoveWorker(k)
	if now || r.grace <= 0 {
		r.dropIndex(k)
		return
	}
	r.removed[k] = r.clock.Now().Add(r.grace).UnixNano()
}

// dropIndex removes a cache domain's blocks from the index.
func (r *Router) dropIndex(k kvroute.WorkerKey) {
	if r.approx != nil {
		r.approx.RemoveWorker(k)
	} else {
		r.index.RemoveWorker(k)
	}
}

// keepDomains cancels the pending removal of the blocks of e's cache
// domains, which are registered again. r.mu is held.
func (r *Router) keepDomains(e *workerEntry) {
	if len(r.removed) == 0 {
		return
	}
	for _, d := range e.domains {
		delete(r.removed, d.key)
	}
}

// expireRemoved removes the blocks of cache domains whose grace has
// passed.
func (r *Router) expireRemoved() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expireRemovedLocked()
}

// expireRemovedLocked is expireRemoved with r.mu held.
func (r *Router) expireRemovedLocked() {
	if len(r.removed) == 0 {
		return
	}
	now := r.clock.Now().UnixNano()
	for k, due := range r.removed {
		if now >= due {
			r.dropIndex(k)
			delete(r.removed, k)
		}
	}
}

// newEntry builds the entry for w, reusing the domains of old.
func (r *Router) newEntry(w Worker, old *workerEntry) (*workerEntry, error) {
	if bs := w.BlockSize(); bs != 0 && bs != r.hasher.BlockSize() {
		return nil, fmt.Errorf("%w: worker %d has block size %d, router hashes blocks of %d", ErrInvalidConfig, w.ID(), bs, r.hasher.BlockSize())
	}
	if w.Role() > RoleDecode {
		return nil, fmt.Errorf("%w: worker %d has unknown role %d", ErrInvalidConfig, w.ID(), w.Role())
	}
	ranks := max(w.DataParallelRanks(), 1)
	if ranks > MaxDataParallelRanks {
		return nil, fmt.Errorf("%w: worker %d has %d data-parallel ranks, at most %d", ErrInvalidConfig, w.ID(), ranks, MaxDataParallelRanks)
	}
	var static scheduling.Load
	if c, ok := w.(Capacity); ok {
		static.MaxBatchedTokens = c.MaxBatchedTokens()
		static.MaxRequests = c.MaxRequests()
		static.KVCapacityBlocks = c.KVCapacityBlocks()
	}
	now := r.clock.Now().UnixNano()
	e := &workerEntry{w: w}
	for rank := range ranks {
		d := &domain{key: kvroute.WorkerKey{ID: w.ID(), Rank: kvroute.DPRank(rank)}, role: w.Role(), static: static}
		if old != nil && rank < len(old.domains) {
			d.domainState = old.domains[rank].domainState // shared: nothing recorded meanwhile is lost
		} else {
			d.domainState = &domainState{added: now}
		}
		e.domains = append(e.domains, d)
	}
	return e, nil
}

// publish builds and stores a new snapshot. r.mu is held.
func (r *Router) publish() {
	s := &snapshot{}
	for _, e := range r.workers {
		s.domains = append(s.domains, e.domains...)
	}
	slices.SortFunc(s.domains, func(a, b *domain) int {
		if c := cmp.Compare(a.key.ID, b.key.ID); c != 0 {
			return c
		}
		return cmp.Compare(a.key.Rank, b.key.Rank)
	})
	s.byKey = newKeyIndex(len(s.domains))
	for i, d := range s.domains {
		s.byKey.put(d.key, i)
		s.roles[d.role]++
		if d.reported.Load() != nil {
			s.reported = true
		}
	}
	for ph := range s.phases {
		ps := &s.phases[ph]
		ps.pos = newKeyIndex(len(s.domains))
		for _, want := range []Health{Healthy, Degraded} {
			for _, d := range s.domains {
				if !phase(ph).accepts(d.role) || d.currentHealth() != want {
					continue
				}
				ps.pos.put(d.key, len(ps.cands))
				ps.cands = append(ps.cands, scheduling.Candidate{Worker: d.key, Load: d.static})
				ps.doms = append(ps.doms, d)
			}
			if want == Healthy {
				ps.healthy = len(ps.cands)
			}
		}
	}
	r.snap.Store(s)
}

// republish rebuilds the snapshot after a domain's health or reporting
// changed.
func (r *Router) republish() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.publish()
}

// Workers returns the registered workers' cache domains, sorted.
func (r *Router) Workers() []kvroute.WorkerKey {
	s := r.snap.Load()
	out := make([]kvroute.WorkerKey, len(s.domains))
	for i, d := range s.domains {
		out[i] = d.key
	}
	return out
}

// Heartbeat records a load report of one cache domain: the engine's own
// metrics (queue depth, KV-cache utilisation, running requests) and
// capacities. Config.LoadReports says what routing takes from it: by
// default only the capacities, the router counting the load in flight
// from its own requests; with LoadReportMerged the whole report, the
// fields the router tracks itself (active prefill tokens, decode blocks,
// request count) combined with its own by the larger of the two counts. A
// heartbeat marks the domain alive (liveness); it does not forgive
// inference errors, which only a successful request or UnhealthyAfter
// without a new error clears (see HealthConfig). It returns
// ErrUnknownWorker for an unregistered domain.
func (r *Router) Heartbeat(w kvroute.WorkerKey, load scheduling.Load) error {
	d := r.domain(w)
	if d == nil {
		return fmt.Errorf("%w: %s", ErrUnknownWorker, w)
	}
	r.heartbeat(d, &load)
	return nil
}

// heartbeat marks d alive and, when load is not nil, records it as d's
// load report.
func (r *Router) heartbeat(d *domain, load *scheduling.Load) {
	first := load != nil && d.reported.Swap(load) == nil
	d.lastHeartbeat.Store(r.clock.Now().UnixNano())
	if !r.rejudge(d) && first {
		r.republish()
	}
	// The report may show capacity freed by traffic this router does not
	// see: let waiting requests look again.
	r.releaseAll()
}

// ReportError records a failure talking to a cache domain (a connection
// error, an engine error response). Consecutive errors make it degraded
// and then unhealthy (HealthConfig). It returns ErrUnknownWorker for an
// unregistered domain.
func (r *Router) ReportError(w kvroute.WorkerKey, err error) error {
	d := r.domain(w)
	if d == nil {
		return fmt.Errorf("%w: %s", ErrUnknownWorker, w)
	}
	r.noteError(d)
	r.log.Debug("worker error", "worker", w.String(), "err", err)
	return nil
}

// noteError counts one more consecutive error of d and re-judges it.
func (r *Router) noteError(d *domain) {
	now := r.clock.Now().UnixNano()
	d.lastError.Store(now)
	d.errors.Add(1)
	r.rejudge(d)
}

// noteSuccess clears d's errors and re-judges it.
func (r *Router) noteSuccess(d *domain) {
	if d.errors.Load() == 0 {
		return
	}
	d.errors.Store(0)
	r.rejudge(d)
}

// Health returns the health of a cache domain, and false when it is not
// registered.
func (r *Router) Health(w kvroute.WorkerKey) (Health, bool) {
	d := r.domain(w)
	if d == nil {
		return Unhealthy, false
	}
	return d.currentHealth(), true
}

func (r *Router) domain(w kvroute.WorkerKey) *domain {
	s := r.snap.Load()
	i, ok := s.byKey.get(w)
	if !ok {
		return nil
	}
	return s.domains[i]
}

// expireApprox drops expired approximate entries at most once a second, so
// that a prediction past its TTL is not matched before the next insert
// prunes it.
func (r *Router) expireApprox() {
	now := r.clock.Now().UnixNano()
	due := r.approxDue.Load()
	if now < due || !r.approxDue.CompareAndSwap(due, now+int64(time.Second)) {
		return
	}
	r.approx.Expire()
}
