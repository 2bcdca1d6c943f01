package indexer

import (
	"container/heap"
	"fmt"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
)

// ApproxConfig configures an Approx index. The zero value is valid.
type ApproxConfig struct {
	// TTL is how long a block recorded for a routing decision is assumed to
	// stay cached. Zero means 120 s (Dynamo's default).
	TTL time.Duration
	// MaxBlocks bounds the number of (block, worker) pairs. When an insert
	// goes over it, the oldest pairs are pruned, leaves before their
	// parents, down to PruneTarget of it. Zero means 2^20.
	MaxBlocks int
	// PruneTarget is the fraction of MaxBlocks kept after pruning. Zero
	// means 0.8.
	PruneTarget float64
	// Clock supplies the time. Nil means the system clock.
	Clock kvroute.Clock
	// Index configures the underlying index.
	Index Config
}

// Approx is an approximate prefix index for engines that publish no KV
// events: the host records the blocks of its own routing decisions, which
// are assumed cached on the chosen worker until they expire.
//
// It wraps an Index (Match and the other read methods are the Index's, and
// as lock-free). Insert, Expire and RemoveWorker serialise on one mutex,
// which protects the expiry queue.
type Approx struct {
	*Index
	ttl    time.Duration
	max    int
	target int
	clock  kvroute.Clock

	// mu protects stamps and queue, and orders the index writes they
	// describe.
	mu     sync.Mutex
	stamps map[approxKey]int64 // last insert time of each live pair
	queue  approxQueue
}

type approxKey struct {
	w   kvroute.WorkerKey
	seq kvroute.SeqHash
}

// approxItem is one insert of a pair; it is stale when the pair was
// inserted again later (its stamp moved on).
type approxItem struct {
	at    int64
	depth uint32
	key   approxKey
}

// approxQueue orders items oldest first and, among equals, deepest first,
// so that leaves go before their parents.
type approxQueue []approxItem

func (q approxQueue) Len() int { return len(q) }
func (q approxQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].depth > q[j].depth
}
func (q approxQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *approxQueue) Push(x any)   { *q = append(*q, x.(approxItem)) }
func (q *approxQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}

// NewApprox returns an empty approximate index.
func NewApprox(cfg ApproxConfig) (*Approx, error) {
	ix, err := New(cfg.Index)
	if err != nil {
		return nil, err
	}
	a := &Approx{Index: ix, ttl: cfg.TTL, max: cfg.MaxBlocks, clock: kvroute.ClockOrSystem(cfg.Clock), stamps: map[approxKey]int64{}}
	if a.ttl == 0 {
		a.ttl = 120 * time.Second
	}
	if a.max == 0 {
		a.max = 1 << 20
	}
	frac := cfg.PruneTarget
	if frac == 0 {
		frac = 0.8
	}
	if a.ttl < 0 || a.max < 0 || frac < 0 || frac > 1 {
		return nil, fmt.Errorf("indexer: invalid approximate index config: ttl %v, max blocks %d, prune target %v", cfg.TTL, cfg.MaxBlocks, cfg.PruneTarget)
	}
	a.target = int(float64(a.max) * frac)
	return a, nil
}

// Insert records that worker w now holds the blocks of a prompt it was
// routed, given by their sequence hashes (as kvroute.Hasher.AppendHashes
// returns them). Blocks already recorded are refreshed. It then expires
// old entries and prunes the index down to its bound when needed.
func (a *Approx) Insert(w kvroute.WorkerKey, seqs []kvroute.SeqHash) {
	now := a.clock.Now().UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	ix := a.Index
	ix.mu.Lock()
	st := storer{ix: ix, ws: ix.worker(w, true), tier: kvroute.TierDevice}
	for i, s := range seqs {
		st.place(kvroute.ExternalHash(s), s, len(seqs)-i)
		k := approxKey{w, s}
		a.stamps[k] = now
		heap.Push(&a.queue, approxItem{at: now, depth: uint32(i), key: k})
	}
	st.flush()
	ix.unlock()
	a.expireLocked(now)
	if len(a.stamps) > a.max {
		a.pruneLocked(a.target)
	}
	if len(a.queue) > 2*len(a.stamps)+1024 {
		a.compactLocked()
	}
}

// Expire drops every entry older than the TTL and returns how many it
// dropped. Insert expires as it goes; hosts that insert rarely call Expire
// from their own timer.
func (a *Approx) Expire() int {
	now := a.clock.Now().UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.expireLocked(now)
}

// Len returns the number of live (block, worker) entries.
func (a *Approx) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.stamps)
}

// RemoveWorker drops w and its entries.
func (a *Approx) RemoveWorker(w kvroute.WorkerKey) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k := range a.stamps {
		if k.w == w {
			delete(a.stamps, k)
		}
	}
	return a.Index.RemoveWorker(w)
}

func (a *Approx) expireLocked(now int64) int {
	cutoff := now - int64(a.ttl)
	n := 0
	for len(a.queue) > 0 && a.queue[0].at <= cutoff {
		if a.dropLocked(heap.Pop(&a.queue).(approxItem)) {
			n++
		}
	}
	return n
}

func (a *Approx) pruneLocked(keep int) {
	for len(a.stamps) > keep && len(a.queue) > 0 {
		a.dropLocked(heap.Pop(&a.queue).(approxItem))
	}
}

// dropLocked removes the pair of it unless it was inserted again since.
func (a *Approx) dropLocked(it approxItem) bool {
	at, ok := a.stamps[it.key]
	if !ok || at != it.at {
		return false
	}
	delete(a.stamps, it.key)
	ix := a.Index
	ix.mu.Lock()
	if ws := ix.worker(it.key.w, false); ws != nil {
		ix.removeBlock(ws, kvroute.ExternalHash(it.key.seq), kvroute.TierDevice)
	}
	ix.unlock()
	return true
}

// compactLocked drops stale items from the queue.
func (a *Approx) compactLocked() {
	live := a.queue[:0]
	for _, it := range a.queue {
		if at, ok := a.stamps[it.key]; ok && at == it.at {
			live = append(live, it)
		}
	}
	a.queue = live
	heap.Init(&a.queue)
}

// ResetWorker drops w's entries and event sequence, keeping w known.
func (a *Approx) ResetWorker(w kvroute.WorkerKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k := range a.stamps {
		if k.w == w {
			delete(a.stamps, k)
		}
	}
	a.Index.ResetWorker(w)
}
