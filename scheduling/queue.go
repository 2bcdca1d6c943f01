package scheduling

import (
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute"
)

// Policy orders waiting requests inside one strict priority class. The
// request with the highest score is admitted first.
type Policy uint8

// The queue policies.
const (
	// FCFS is first come, first served: score = PriorityJump − arrival
	// offset (seconds since the queue was created). It bounds tail latency.
	FCFS Policy = iota
	// LCFS is last come, first served: score = PriorityJump + arrival
	// offset. It favours new arrivals under overload; mostly for
	// comparisons.
	LCFS
	// WSPT is weighted shortest processing time (Smith's rule): score =
	// (1 + PriorityJump) / job size, where the job size is NewTokens +
	// OutputTokenWeight · OutputTokens. It minimises mean completion time
	// by admitting short or well-cached requests first.
	WSPT
)

// String returns the policy's name.
func (p Policy) String() string {
	switch p {
	case FCFS:
		return "fcfs"
	case LCFS:
		return "lcfs"
	case WSPT:
		return "wspt"
	}
	return fmt.Sprintf("policy(%d)", uint8(p))
}

// ParsePolicy returns the policy named s ("fcfs", "lcfs" or "wspt").
func ParsePolicy(s string) (Policy, error) {
	for _, p := range []Policy{FCFS, LCFS, WSPT} {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown queue policy %q", ErrInvalidConfig, s)
}

// DefaultQueueCapacity is the queue capacity when QueueConfig leaves it zero.
const DefaultQueueCapacity = 1024

// DefaultOutputTokenWeight is the OutputTokenWeight a zero QueueConfig
// value means: an expected output token weighs as much as one prompt token
// to prefill.
const DefaultOutputTokenWeight = 1.0

// QueueConfig configures a Queue.
type QueueConfig struct {
	// Policy orders requests inside a priority class. The zero value is FCFS.
	Policy Policy
	// Capacity is the most requests that may wait; Wait rejects more with
	// *QueueFullError. Zero means DefaultQueueCapacity.
	Capacity int
	// Threshold is the fraction of a worker's MaxBatchedTokens of active
	// prefill above which Saturated counts the worker as full. Zero means 1.
	Threshold float64
	// OutputTokenWeight is the work of one expected output token in prefill
	// tokens, in WSPT's job size. Zero means DefaultOutputTokenWeight;
	// negative values are rejected.
	OutputTokenWeight float64
	// Clock supplies arrival times for items without one and the epoch of
	// arrival offsets. Nil means kvroute.SystemClock.
	Clock kvroute.Clock
	// Logger receives debug records of rejections. Nil discards.
	Logger *slog.Logger
}

// Item describes a request to the queue.
type Item struct {
	// Priority is the strict priority class; higher classes go first.
	Priority uint32
	// PriorityJump moves the item ahead in its class: seconds for FCFS and
	// LCFS, extra weight for WSPT. Negative values count as zero.
	PriorityJump float64
	// Arrival is when the request arrived. Zero means when Wait is called.
	// A request that waits again after being released keeps its place by
	// passing the same Arrival.
	Arrival time.Time
	// NewTokens is the prefill work of the request: its prompt tokens less
	// the longest cached prefix among the workers (WSPT). Values below 1
	// count as 1.
	NewTokens int
	// OutputTokens is the expected output length (Request.
	// ExpectedOutputTokens), zero when unknown. WSPT adds it, weighted by
	// QueueConfig.OutputTokenWeight, to the job size.
	OutputTokens int
	// Releases, when not zero, is Queue.Releases read before the loads
	// the caller judged saturated: when a release came since (load freed
	// while the caller looked), Wait does not wait for the next one but
	// returns nil at once, for the caller to look at the loads again.
	Releases uint64
}

// NewItem returns the Item for req given its candidates: the request's
// priority, jump, arrival and expected output, and its prompt tokens less
// the best cached prefix (in blocks times the block size) among cands.
func NewItem(req *Request, cands []Candidate) Item {
	best := 0
	for i := range cands {
		best = max(best, cands[i].CachedBlocks())
	}
	bs := req.BlockSize
	if bs <= 0 {
		bs = DefaultBlockSize
	}
	return Item{
		Priority:     req.Priority,
		PriorityJump: req.PriorityJump,
		Arrival:      req.Arrival,
		NewTokens:    req.PromptTokens - best*bs,
		OutputTokens: max(req.ExpectedOutputTokens, 0),
	}
}

// Queue is the admission queue: requests wait in it while every eligible
// worker is saturated with prefill work, and are released in order as load
// drops: strict priority class first, then the policy's score, then
// arrival order.
//
// The queue does no I/O and starts no goroutines. The host (the router)
// drives it:
//
//  1. Per request, compute saturated := q.Saturated(cands) over the
//     eligible candidates and call q.Wait(ctx, item, saturated). Wait
//     returns at once when nothing is saturated and nobody waits;
//     otherwise the request joins the queue and the call blocks.
//  2. Whenever load drops (a request's prefill completes or it is freed)
//     and the workers are not saturated, call q.Release(1) (or more) to
//     admit the best waiting requests.
//  3. A released request re-reads the loads; if the workers are saturated
//     again it calls Wait again with the same Item (same Arrival), which
//     keeps its place in policy order.
//
// Wait returns early with the context's error when ctx ends; the request
// then leaves the queue. All methods are safe for concurrent use; the
// waiting set is a binary heap under one mutex, which Wait skips entirely
// when the queue is empty and the workers are not saturated.
type Queue struct {
	policy    Policy
	capacity  int
	threshold float64
	outWeight float64
	clock     kvroute.Clock
	log       *slog.Logger
	epoch     time.Time

	waiting atomic.Int64 // len(heap), readable without mu
	// releases counts Release calls, from 1 (see Item.Releases).
	releases atomic.Uint64
	mu       sync.Mutex // protects heap, seq and closed
	heap     waiterHeap
	seq      uint64
	closed   bool

	pool sync.Pool // of *waiter
}

// waiter is one blocked Wait call.
type waiter struct {
	priority uint32
	score    float64
	arrival  int64         // Item.Arrival, unix ns: order among equal scores
	seq      uint64        // admission order among equal scores and arrivals
	index    int           // position in the heap, -1 once removed
	ready    chan struct{} // buffered(1): signalled when released or closed
	closed   bool          // released because the queue was closed
}

// NewQueue returns an empty Queue. It returns an error wrapping
// ErrInvalidConfig for an unknown policy or a negative capacity or
// threshold.
func NewQueue(cfg QueueConfig) (*Queue, error) {
	switch {
	case cfg.Policy > WSPT:
		return nil, fmt.Errorf("%w: queue policy %d", ErrInvalidConfig, cfg.Policy)
	case cfg.Capacity < 0:
		return nil, fmt.Errorf("%w: queue capacity %d", ErrInvalidConfig, cfg.Capacity)
	case !(cfg.Threshold >= 0) || math.IsInf(cfg.Threshold, 0):
		return nil, fmt.Errorf("%w: queue threshold %v", ErrInvalidConfig, cfg.Threshold)
	case !(cfg.OutputTokenWeight >= 0) || math.IsInf(cfg.OutputTokenWeight, 0):
		return nil, fmt.Errorf("%w: output token weight %v", ErrInvalidConfig, cfg.OutputTokenWeight)
	}
	q := &Queue{
		policy:    cfg.Policy,
		capacity:  cfg.Capacity,
		threshold: cfg.Threshold,
		outWeight: cfg.OutputTokenWeight,
		clock:     kvroute.ClockOrSystem(cfg.Clock),
		log:       cfg.Logger,
	}
	if q.capacity == 0 {
		q.capacity = DefaultQueueCapacity
	}
	if q.threshold == 0 {
		q.threshold = 1
	}
	if q.outWeight == 0 {
		q.outWeight = DefaultOutputTokenWeight
	}
	if q.log == nil {
		q.log = slog.New(slog.DiscardHandler)
	}
	q.epoch = q.clock.Now()
	q.releases.Store(1)
	q.pool.New = func() any { return &waiter{ready: make(chan struct{}, 1)} }
	return q, nil
}

// Policy returns the queue's policy.
func (q *Queue) Policy() Policy { return q.policy }

// Len returns the number of waiting requests.
func (q *Queue) Len() int { return int(q.waiting.Load()) }

// Releases returns the number of Release calls so far, plus one: a caller
// about to read the loads it will pass to Saturated and Wait reads it
// first (Item.Releases), so that a release between the two is not lost.
func (q *Queue) Releases() uint64 { return q.releases.Load() }

// Saturated reports whether every candidate has more active prefill tokens
// than Threshold × MaxBatchedTokens. Candidates whose MaxBatchedTokens is
// unknown are never saturated; no candidates means not saturated.
func (q *Queue) Saturated(cands []Candidate) bool {
	if len(cands) == 0 {
		return false
	}
	for i := range cands {
		l := &cands[i].Load
		if l.MaxBatchedTokens <= 0 || float64(l.ActivePrefillTokens) <= q.threshold*float64(l.MaxBatchedTokens) {
			return false
		}
	}
	return true
}

// Score returns the policy score of it (higher is admitted earlier within
// its priority class).
func (q *Queue) Score(it Item) float64 {
	jump := max(it.PriorityJump, 0)
	if jump != jump {
		jump = 0
	}
	switch q.policy {
	case LCFS:
		return jump + q.offset(it.Arrival)
	case WSPT:
		size := float64(max(it.NewTokens, 0)) + q.outWeight*float64(max(it.OutputTokens, 0))
		return (1 + jump) / max(size, 1)
	}
	return jump - q.offset(it.Arrival)
}

// offset returns the seconds from the queue's epoch to arrival.
func (q *Queue) offset(arrival time.Time) float64 {
	if arrival.IsZero() {
		arrival = q.clock.Now()
	}
	return arrival.Sub(q.epoch).Seconds()
}

// Wait admits the request described by it, blocking while it must queue.
// saturated is the caller's verdict on the eligible workers (Saturated).
// When saturated is false and nobody waits, Wait returns nil at once.
// Otherwise the request joins the queue; if saturated is false the best
// waiting request is released right away (the workers have room, and
// waiting requests go first). Wait returns nil once released, an error
// wrapping ctx.Err() when ctx ends first (the request leaves the queue),
// *QueueFullError when Capacity requests already wait, and ErrQueueClosed
// after Close.
func (q *Queue) Wait(ctx context.Context, it Item, saturated bool) error {
	if !saturated && q.waiting.Load() == 0 {
		return nil
	}
	if it.Arrival.IsZero() {
		it.Arrival = q.clock.Now()
	}
	score := q.Score(it)
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrQueueClosed
	}
	if !saturated && len(q.heap) == 0 {
		q.mu.Unlock()
		return nil
	}
	if len(q.heap) >= q.capacity {
		q.mu.Unlock()
		q.log.LogAttrs(ctx, slog.LevelDebug, "scheduling: admission queue full", slog.Int("capacity", q.capacity))
		return &QueueFullError{Capacity: q.capacity}
	}
	w := q.pool.Get().(*waiter)
	w.priority, w.score, w.arrival, w.seq, w.closed = it.Priority, score, it.Arrival.UnixNano(), q.seq, false
	q.seq++
	heap.Push(&q.heap, w)
	q.waiting.Store(int64(len(q.heap)))
	if !saturated {
		q.releaseLocked(1)
	} else if it.Releases != 0 && q.releases.Load() != it.Releases {
		// Load was freed since the caller read the loads, and the release
		// found nobody waiting: look again instead of waiting for the
		// next. (The waiter is in the heap before this check and Release
		// counts before it looks for waiters, so one of the two sees the
		// other.)
		heap.Remove(&q.heap, w.index)
		q.waiting.Store(int64(len(q.heap)))
		q.mu.Unlock()
		q.pool.Put(w)
		return nil
	}
	q.mu.Unlock()

	select {
	case <-w.ready:
		closed := w.closed
		q.pool.Put(w)
		if closed {
			return ErrQueueClosed
		}
		return nil
	case <-ctx.Done():
	}
	q.mu.Lock()
	if w.index >= 0 {
		heap.Remove(&q.heap, w.index)
		q.waiting.Store(int64(len(q.heap)))
		q.mu.Unlock()
		q.pool.Put(w)
		return fmt.Errorf("scheduling: waiting for admission: %w", ctx.Err())
	}
	// Released concurrently with the cancellation: hand the admission on.
	if !q.closed {
		q.releaseLocked(1)
	}
	q.mu.Unlock()
	<-w.ready
	q.pool.Put(w)
	return fmt.Errorf("scheduling: waiting for admission: %w", ctx.Err())
}

// Release admits up to n waiting requests in order and returns how many it
// admitted. Every call counts in Releases, even with nobody waiting or n
// below 1: call it whenever load is freed.
func (q *Queue) Release(n int) int {
	q.releases.Add(1)
	if n < 1 || q.waiting.Load() == 0 {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.releaseLocked(n)
}

// releaseLocked pops and signals up to n waiters. The caller holds q.mu.
func (q *Queue) releaseLocked(n int) int {
	k := 0
	for ; k < n && len(q.heap) > 0; k++ {
		w := heap.Pop(&q.heap).(*waiter)
		w.ready <- struct{}{}
	}
	q.waiting.Store(int64(len(q.heap)))
	return k
}

// Close releases every waiting request with ErrQueueClosed and makes later
// Wait calls that would queue return ErrQueueClosed. It is idempotent.
func (q *Queue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for len(q.heap) > 0 {
		w := heap.Pop(&q.heap).(*waiter)
		w.closed = true
		w.ready <- struct{}{}
	}
	q.waiting.Store(0)
}

// waiterHeap is a max-heap of waiters by (priority, score, −arrival,
// −seq); it implements heap.Interface and keeps each waiter's index
// current.
type waiterHeap []*waiter

// Len implements heap.Interface.
func (h waiterHeap) Len() int { return len(h) }

// Less orders by class, then score (both descending), then arrival: the
// Item's (kept when a request waits again after a release), then the
// order of the Wait calls.
func (h waiterHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.priority != b.priority {
		return a.priority > b.priority
	}
	if a.score != b.score {
		return a.score > b.score
	}
	if a.arrival != b.arrival {
		return a.arrival < b.arrival
	}
	return a.seq < b.seq
}

// Swap implements heap.Interface and updates the indexes.
func (h waiterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

// Push appends a *waiter.
func (h *waiterHeap) Push(x any) {
	w := x.(*waiter)
	w.index = len(*h)
	*h = append(*h, w)
}

// Pop removes the last waiter and marks it out of the heap.
func (h *waiterHeap) Pop() any {
	old := *h
	n := len(old) - 1
	w := old[n]
	old[n] = nil
	w.index = -1
	*h = old[:n]
	return w
}
