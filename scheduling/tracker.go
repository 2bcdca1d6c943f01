package scheduling

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvroute/kvroute"
)

// RequestID identifies a tracked request. The host chooses ids; they must
// be unique among the requests tracked at the same time.
type RequestID uint64

// DefaultRequestTTL is how long a request that is never freed stays
// tracked when TrackerConfig leaves TTL zero.
const DefaultRequestTTL = 10 * time.Minute

// TrackerConfig configures a Tracker.
type TrackerConfig struct {
	// BlockSize is the tokens per KV block, used to turn output tokens into
	// blocks. Zero means DefaultBlockSize.
	BlockSize int
	// TTL is how long a request may go without an update (Add, PrefillDone,
	// AddOutputTokens) before Expire drops it, so requests whose Free was
	// lost do not inflate a worker's load forever. Zero means
	// DefaultRequestTTL.
	TTL time.Duration
	// Clock supplies time for expiry. Nil means kvroute.SystemClock.
	Clock kvroute.Clock
	// Logger receives debug records of expired requests. Nil discards.
	Logger *slog.Logger
}

// WorkerLoad is the load a Tracker attributes to one worker.
type WorkerLoad struct {
	// ActiveRequests is the number of tracked requests on the worker.
	ActiveRequests int
	// ActivePrefillTokens is the sum of the prefill tokens of its requests
	// whose prefill has not completed.
	ActivePrefillTokens int
	// ActiveBlocks is the number of distinct prompt blocks of its requests
	// plus their output blocks.
	ActiveBlocks int
}

// Tracker keeps the active requests of every worker: their prompt blocks
// (deduplicated across requests on the same worker by sequence hash), their
// uncached prefill tokens until the first token, and their output blocks.
// It is the router's own view of load, current between engine metrics.
//
// A request's life is Add → PrefillDone (first token: its prefill tokens
// are released, its blocks stay) → AddOutputTokens as tokens are
// generated → Free (completion or cancellation). PrefillDone,
// AddOutputTokens and Free of an unknown or already freed request do
// nothing and return false. Requests not updated for TTL are dropped by
// Expire, which the host calls periodically.
//
// Layout: requests live in 64 shards, each a map under its own mutex;
// workers live in an immutable open-addressing table, replaced when a
// worker appears or is removed and read with one atomic load. Each
// worker has a mutex over its active blocks (a compressed trie of its
// requests' chains, so that Add and Free cost a few lookups and a copy
// rather than one table update per block) and its requests' mutable
// fields, and atomic counters, so Load takes no lock and
// PotentialDecodeBlocks takes only the worker's mutex, for well under a
// microsecond. It is a plain mutex, not a reader-writer lock, on purpose:
// sync.Mutex spins briefly before it sleeps, while a reader meeting a
// writer on a sync.RWMutex sleeps at once, and with decisions on two
// cores reading the loads of the workers the other core is adding to,
// those sleeps left a core idle (two goroutines made 1.0× the decisions
// of one; with the mutex 1.4×). Lock order is request shard, then
// worker. All methods are safe for concurrent use.
type Tracker struct {
	blockSize int
	ttl       int64 // nanoseconds
	clock     kvroute.Clock
	log       *slog.Logger

	shards [trackerShards]requestShard

	workers atomic.Pointer[workerTable] // copy-on-write
	wmu     sync.Mutex                  // serialises writers of workers

	pool sync.Pool // of *trackedRequest
}

// trackerShards is the number of request shards: a power of two well above
// the core count, so concurrent Add/Free rarely meet on one mutex.
const trackerShards = 64

// requestShard is one shard of the request map, padded to its own cache
// lines so that neighbouring shard mutexes do not share one.
type requestShard struct {
	mu sync.Mutex // protects m
	m  map[RequestID]*trackedRequest
	_  [48]byte
}

// trackedRequest is one active request. ws, id and leaf are set by Add
// and read only under the shard lock; the other fields are changed under
// both the shard lock and ws.mu.
type trackedRequest struct {
	id            RequestID
	ws            *workerState
	leaf          int32 // the request's leaf segment in ws.blocks
	prefillTokens int   // released by PrefillDone
	prefillDone   bool  // PrefillDone was called
	outputTokens  int   // reported by AddOutputTokens
	outputBlocks  int   // ceil(outputTokens / blockSize)
	deadline      int64 // unix nanoseconds after which Expire drops it
}

// workerState is the tracked load of one worker. Its size is a multiple
// of 128 bytes (the allocator then aligns it to 128), so that a decision
// reading the load of every candidate touches one line per worker with no
// request and a write to one worker invalidates no other worker's lines.
type workerState struct {
	workerFields
	_ [128 - unsafe.Sizeof(workerFields{})%128]byte
}

// workerFields are the fields of a workerState.
type workerFields struct {
	requests atomic.Int64 // number of active requests
	prefill  atomic.Int64 // active prefill tokens
	unique   atomic.Int64 // blocks.len() + output blocks of all requests

	mu      sync.Mutex // protects blocks and removed
	removed bool       // RemoveWorker dropped this state
	blocks  chainSet   // the active prompt blocks
}

// NewTracker returns an empty Tracker. It returns an error wrapping
// ErrInvalidConfig for a negative block size or TTL.
func NewTracker(cfg TrackerConfig) (*Tracker, error) {
	if cfg.BlockSize < 0 || cfg.BlockSize > kvroute.MaxBlockSize {
		return nil, fmt.Errorf("%w: block size %d", ErrInvalidConfig, cfg.BlockSize)
	}
	if cfg.TTL < 0 {
		return nil, fmt.Errorf("%w: request ttl %v", ErrInvalidConfig, cfg.TTL)
	}
	t := &Tracker{
		blockSize: cfg.BlockSize,
		ttl:       int64(cfg.TTL),
		clock:     kvroute.ClockOrSystem(cfg.Clock),
		log:       cfg.Logger,
	}
	if t.blockSize == 0 {
		t.blockSize = DefaultBlockSize
	}
	if t.ttl == 0 {
		t.ttl = int64(DefaultRequestTTL)
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	for i := range t.shards {
		t.shards[i].m = make(map[RequestID]*trackedRequest)
	}
	t.workers.Store(newWorkerTable(nil))
	t.pool.New = func() any { return new(trackedRequest) }
	return t, nil
}

// shard returns the shard of id; ids are mixed so sequential ids spread.
func (t *Tracker) shard(id RequestID) *requestShard {
	h := uint64(id) * splitmixGamma
	return &t.shards[h>>(64-6)]
}

// worker returns the state of w, or nil.
func (t *Tracker) worker(w kvroute.WorkerKey) *workerState {
	return t.workers.Load().get(w)
}

// workerOrCreate returns the state of w, creating it when missing.
func (t *Tracker) workerOrCreate(w kvroute.WorkerKey) *workerState {
	if ws := t.worker(w); ws != nil {
		return ws
	}
	t.wmu.Lock()
	defer t.wmu.Unlock()
	old := t.workers.Load()
	if ws := old.get(w); ws != nil {
		return ws
	}
	next := old.all()
	ws := new(workerState)
	next[w] = ws
	t.workers.Store(newWorkerTable(next))
	return ws
}

// Add starts tracking request id on worker w: blocks are the chained
// sequence hashes of its full prompt blocks, from the first, and
// prefillTokens the prompt tokens the worker must compute (the prompt less
// what it has cached). blocks is copied, not retained. Add returns
// ErrDuplicateRequest when id is already tracked and an error wrapping
// ErrInvalidRequest when prefillTokens is negative.
func (t *Tracker) Add(id RequestID, w kvroute.WorkerKey, blocks []kvroute.SeqHash, prefillTokens int) error {
	if prefillTokens < 0 {
		return fmt.Errorf("%w: negative prefill tokens %d", ErrInvalidRequest, prefillTokens)
	}
	sh := t.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, dup := sh.m[id]; dup {
		return fmt.Errorf("%w: %d", ErrDuplicateRequest, id)
	}
	r := t.pool.Get().(*trackedRequest)
	*r = trackedRequest{
		id:            id,
		prefillTokens: prefillTokens,
		deadline:      t.deadline(),
	}
	for {
		ws := t.workerOrCreate(w)
		ws.mu.Lock()
		if ws.removed { // lost a race with RemoveWorker: use the new state
			ws.mu.Unlock()
			continue
		}
		leaf, added := ws.blocks.add(blocks)
		r.leaf = leaf
		ws.unique.Add(int64(added))
		ws.prefill.Add(int64(prefillTokens))
		ws.requests.Add(1)
		ws.mu.Unlock()
		r.ws = ws
		break
	}
	sh.m[id] = r
	return nil
}

// PrefillDone records that request id produced its first token: its
// prefill tokens no longer load the worker; its blocks stay. It returns
// false when id is not tracked or its prefill was already done.
func (t *Tracker) PrefillDone(id RequestID) bool {
	return t.update(id, func(r *trackedRequest, ws *workerState) bool {
		if r.prefillDone {
			return false
		}
		r.prefillDone = true
		ws.prefill.Add(-int64(r.prefillTokens))
		return true
	})
}

// AddOutputTokens records n more generated tokens of request id. Output
// blocks are private to the request: each started block of BlockSize
// output tokens adds one active block to the worker. It returns false when
// id is not tracked or n is negative.
func (t *Tracker) AddOutputTokens(id RequestID, n int) bool {
	if n < 0 {
		return false
	}
	return t.update(id, func(r *trackedRequest, ws *workerState) bool {
		r.outputTokens += min(n, math.MaxInt-r.outputTokens-t.blockSize)
		blocks := (r.outputTokens + t.blockSize - 1) / t.blockSize
		ws.unique.Add(int64(blocks - r.outputBlocks))
		r.outputBlocks = blocks
		return true
	})
}

// update runs f on request id under its shard and worker locks and, when f
// reports a change, extends the request's deadline. It returns false when
// id is not tracked, its worker was removed, or f returns false.
func (t *Tracker) update(id RequestID, f func(r *trackedRequest, ws *workerState) bool) bool {
	sh := t.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r := sh.m[id]
	if r == nil {
		return false
	}
	ws := r.ws
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.removed || !f(r, ws) {
		return false
	}
	r.deadline = t.deadline()
	return true
}

// deadline returns when a request touched now expires: now plus the TTL,
// or never (the largest time) when that sum overflows.
func (t *Tracker) deadline() int64 {
	now := t.clock.Now().UnixNano()
	if int64(t.ttl) > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + int64(t.ttl)
}

// Free stops tracking request id (completed, cancelled or failed) and
// releases its load. It returns false when id is not tracked.
func (t *Tracker) Free(id RequestID) bool {
	sh := t.shard(id)
	sh.mu.Lock()
	r := sh.m[id]
	if r == nil {
		sh.mu.Unlock()
		return false
	}
	delete(sh.m, id)
	r.ws.release(r)
	sh.mu.Unlock()
	t.recycle(r)
	return true
}

// release removes r's load from ws. The caller holds r's shard lock and
// has removed r from its shard.
func (ws *workerState) release(r *trackedRequest) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.removed {
		return
	}
	removed := ws.blocks.remove(r.leaf)
	ws.unique.Add(-int64(removed) - int64(r.outputBlocks))
	if !r.prefillDone {
		ws.prefill.Add(-int64(r.prefillTokens))
	}
	ws.requests.Add(-1)
}

// recycle returns r to the pool.
func (t *Tracker) recycle(r *trackedRequest) {
	*r = trackedRequest{}
	t.pool.Put(r)
}

// Load returns the load the tracker attributes to w; zero for a worker it
// does not know. It takes no lock.
func (t *Tracker) Load(w kvroute.WorkerKey) WorkerLoad {
	ws := t.worker(w)
	if ws == nil {
		return WorkerLoad{}
	}
	return WorkerLoad{
		ActiveRequests:      int(ws.requests.Load()),
		ActivePrefillTokens: int(ws.prefill.Load()),
		ActiveBlocks:        int(ws.unique.Load()),
	}
}

// PotentialDecodeBlocks returns the active blocks w would hold if it got a
// request with the given prompt blocks: its active blocks plus the
// request's blocks not already active there. blocks must be a chain of
// sequence hashes from the first block, as Add takes them; then the blocks
// already active form a prefix of it (every tracked request holds its whole
// chain), and the count takes one table lookup per run of blocks shared by
// a different set of the worker's requests. It allocates nothing.
func (t *Tracker) PotentialDecodeBlocks(w kvroute.WorkerKey, blocks []kvroute.SeqHash) int {
	ws := t.worker(w)
	if ws == nil {
		return len(blocks)
	}
	ws.mu.Lock()
	active := int(ws.unique.Load())
	overlap := ws.blocks.prefix(blocks)
	ws.mu.Unlock()
	return active + len(blocks) - overlap
}

// FillLoad sets c.Load's ActiveRequests, ActivePrefillTokens,
// ActiveDecodeBlocks and PotentialDecodeBlocks from the tracker, for a
// request with the given prompt blocks (see PotentialDecodeBlocks). Other
// fields of c.Load are left as they are. A worker with no active request
// costs one atomic load; otherwise the cost is that of
// PotentialDecodeBlocks. It allocates nothing.
func (t *Tracker) FillLoad(c *Candidate, blocks []kvroute.SeqHash) {
	ws := t.worker(c.Worker)
	if ws == nil || ws.requests.Load() == 0 {
		c.Load.ActiveRequests, c.Load.ActivePrefillTokens, c.Load.ActiveDecodeBlocks = 0, 0, 0
		c.Load.PotentialDecodeBlocks = len(blocks)
		return
	}
	ws.mu.Lock()
	active := int(ws.unique.Load())
	overlap := ws.blocks.prefix(blocks)
	c.Load.ActiveRequests = int(ws.requests.Load())
	c.Load.ActivePrefillTokens = int(ws.prefill.Load())
	ws.mu.Unlock()
	c.Load.ActiveDecodeBlocks = active
	c.Load.PotentialDecodeBlocks = active + len(blocks) - overlap
}

// Expire drops every request not updated for the TTL and returns how many
// it dropped. The host calls it periodically (every few seconds); it scans
// all requests.
func (t *Tracker) Expire() int {
	now := t.clock.Now().UnixNano()
	dropped := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for id, r := range sh.m {
			if r.deadline > now {
				continue
			}
			delete(sh.m, id)
			r.ws.release(r)
			t.log.LogAttrs(context.Background(), slog.LevelDebug, "scheduling: request expired",
				slog.Uint64("request", uint64(id)))
			t.recycle(r)
			dropped++
		}
		sh.mu.Unlock()
	}
	return dropped
}

// RemoveWorker forgets worker w and every request tracked on it, and
// returns the number of requests dropped. Later PrefillDone, AddOutputTokens
// and Free calls for those requests return false.
func (t *Tracker) RemoveWorker(w kvroute.WorkerKey) int {
	t.wmu.Lock()
	old := t.workers.Load()
	ws := old.get(w)
	if ws == nil {
		t.wmu.Unlock()
		return 0
	}
	next := old.all()
	delete(next, w)
	t.workers.Store(newWorkerTable(next))
	t.wmu.Unlock()

	ws.mu.Lock()
	ws.removed = true
	ws.blocks.reset()
	ws.requests.Store(0)
	ws.prefill.Store(0)
	ws.unique.Store(0)
	ws.mu.Unlock()

	dropped := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for id, r := range sh.m {
			if r.ws == ws {
				delete(sh.m, id)
				t.recycle(r)
				dropped++
			}
		}
		sh.mu.Unlock()
	}
	return dropped
}

// Len returns the number of tracked requests.
func (t *Tracker) Len() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// TTL returns how long a request may go without an update before Expire
// drops it (TrackerConfig.TTL, or its default).
func (t *Tracker) TTL() time.Duration { return time.Duration(t.ttl) }

// BlockSize returns the tokens per KV block by which the tracker counts
// output blocks.
func (t *Tracker) BlockSize() int { return t.blockSize }
