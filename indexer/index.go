package indexer

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v3"

	"github.com/kvroute/kvroute"
)

// Config configures an Index. The zero value is valid.
type Config struct {
	// Hasher hashes the token ids that Stored events may carry instead of
	// block hashes. It must use the engines' block size and namespace; an
	// event's LoRA name selects the adapter seed. Zero means
	// kvroute.DefaultBlockSize with no namespace.
	Hasher kvroute.Hasher
	// Logger receives debug records about rejected events. Nil discards.
	Logger *slog.Logger
	// SizeHint is the number of blocks to size the index for, avoiding
	// growth while it fills. Zero means start small.
	SizeHint int
	// Clock timestamps applied events (LastUpdate). Nil means the system
	// clock.
	Clock kvroute.Clock
}

// Index is the cluster prefix index: for every block (a token prefix named
// by its chained sequence hash) it records which cache domains hold it, and
// in which storage tiers.
//
// The blocks form a prefix tree stored as a compressed radix tree: a node
// is a run of consecutive blocks of one path that exactly the same workers
// hold in the same tiers, with one holder bit set per tier for the whole
// run. A table from sequence hash to (node, position) finds the run that
// continues a request's prefix; matching then compares the request's hashes
// with the run's in contiguous memory, so a request costs about one table
// lookup per run rather than one per block. Worker identities are interned
// into dense slots so that holder sets are a few machine words.
//
// When a worker comes to hold only part of a run (it stores or evicts some
// of its blocks), the run is split at the boundaries, moving the shorter
// side to a new node; no block any worker still holds is ever dropped, so
// an eviction in the middle of a chain leaves the blocks after it indexed,
// reachable again once the evicted block returns.
//
// Concurrency: Match, Size, Stats, LastUpdate and the other read methods
// take no lock and may run on any number of goroutines while events are
// applied; they see each block's holder set as of some moment during the
// call. Writes (Apply, ResetWorker, RemoveWorker, Dump) serialise on one
// mutex. The caller applies each worker's events in order.
type Index struct {
	hasher kvroute.Hasher
	log    *slog.Logger
	clock  kvroute.Clock

	// mu serialises every write and protects the writer-only state: the
	// workers' engine-hash maps and sequence numbers, the nodes' writer
	// fields, freeSlots.
	mu     sync.Mutex
	blocks *blockTable

	// workers maps each known cache domain to its state; LastUpdate reads
	// it without mu.
	workers *xsync.MapOf[kvroute.WorkerKey, *workerState]

	freeSlots []int
	// slotKeys is an immutable slice indexed by slot, republished whenever
	// a slot is taken or freed; Match reads it without a lock.
	slotKeys atomic.Pointer[[]slotKey]

	nodeCount   atomic.Int64 // live nodes
	nodeBytes   atomic.Int64 // memory of live nodes' arrays
	pairCount   atomic.Int64
	extraChunks atomic.Int64
	entryCount  atomic.Int64
	stats       counters

	scratch []int // slots, for the writer
}

// slotKey is the worker a slot belongs to; ok is false for a free slot.
type slotKey struct {
	key kvroute.WorkerKey
	ok  bool
}

// counters are the event statistics, updated atomically.
type counters struct {
	applied, duplicates, gaps, unknownParents, unknownRemoved, invalid atomic.Uint64
}

// workerState is one cache domain's part of the index. Its fields but
// lastUpdate are protected by the index's mu.
type workerState struct {
	key       kvroute.WorkerKey
	slot      int
	blocks    extMap
	dups      map[dupKey]int // extra engine hashes for one (block, tier); rare
	lastID    uint64
	sequenced bool

	// lastUpdate is when an event was last applied, unix ns; read without
	// the lock by LastUpdate.
	lastUpdate atomic.Int64
}

// entry is a block a worker holds, under the engine's hash for it.
type entry struct {
	seq   kvroute.SeqHash
	tiers uint8 // bit t set: held in tier t
}

type dupKey struct {
	seq  kvroute.SeqHash
	tier kvroute.Tier
}

// New returns an empty index. It returns an error when cfg.Hasher is
// neither zero nor valid.
func New(cfg Config) (*Index, error) {
	h := cfg.Hasher
	if !h.Valid() {
		if h != (kvroute.Hasher{}) {
			return nil, fmt.Errorf("indexer: invalid hasher")
		}
		h = kvroute.MustHasher(kvroute.HasherConfig{})
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ix := &Index{
		hasher:  h,
		log:     log,
		clock:   kvroute.ClockOrSystem(cfg.Clock),
		blocks:  newBlockTable(cfg.SizeHint),
		workers: xsync.NewMapOf[kvroute.WorkerKey, *workerState](),
	}
	empty := []slotKey{}
	ix.slotKeys.Store(&empty)
	return ix, nil
}

// worker returns the state of w, creating it when create is set. ix.mu is
// held.
func (ix *Index) worker(w kvroute.WorkerKey, create bool) *workerState {
	if ws, ok := ix.workers.Load(w); ok || !create {
		return ws
	}
	ws := &workerState{key: w, slot: ix.takeSlot(w), blocks: newExtMap()}
	ix.workers.Store(w, ws)
	return ws
}

// takeSlot interns w into the lowest free slot. ix.mu is held.
func (ix *Index) takeSlot(w kvroute.WorkerKey) int {
	keys := slices.Clone(*ix.slotKeys.Load())
	var slot int
	if n := len(ix.freeSlots); n > 0 {
		slices.Sort(ix.freeSlots)
		slot = ix.freeSlots[0]
		ix.freeSlots = ix.freeSlots[1:]
	} else {
		slot = len(keys)
		keys = append(keys, slotKey{})
	}
	keys[slot] = slotKey{key: w, ok: true}
	ix.slotKeys.Store(&keys)
	return slot
}

// freeSlot releases slot. ix.mu is held.
func (ix *Index) freeSlot(slot int) {
	keys := slices.Clone(*ix.slotKeys.Load())
	keys[slot] = slotKey{}
	ix.freeSlots = append(ix.freeSlots, slot)
	ix.slotKeys.Store(&keys)
}

// Apply applies one event to the index.
//
// It returns nil when the event was applied, and otherwise:
//   - an error wrapping kvroute.ErrInvalidEvent for a malformed event (not
//     applied; drop it; its ID counts as seen when it is the next one);
//   - ErrDuplicate when the ID is not newer than the worker's last (not
//     applied; drop it);
//   - a *GapError (matching ErrGap) when the ID skips events (not applied;
//     replay from GapError.Want, or ResetWorker and go on);
//   - an *UnknownParentError (matching ErrUnknownParent) when a Stored
//     event's parent is unknown for its worker (consumed, nothing attached).
//
// Removing a block the worker does not hold is counted in Stats and is not
// an error. Apply does not retain ev or its slices.
func (ix *Index) Apply(ev *kvroute.Event) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if err := ev.Validate(); err != nil {
		ix.stats.invalid.Add(1)
		// A malformed event in sequence is consumed, like one with an
		// unknown parent: replaying it would fail again, so the worker's
		// stream must go on past it.
		if ev.ID != 0 {
			if ws := ix.worker(ev.Worker, false); ws != nil {
				if !ws.sequenced || ev.ID == ws.lastID+1 {
					ws.lastID, ws.sequenced = ev.ID, true
				}
			}
		}
		return err
	}
	ws := ix.worker(ev.Worker, true)
	if ev.ID != 0 && ws.sequenced {
		switch {
		case ev.ID <= ws.lastID:
			ix.stats.duplicates.Add(1)
			return fmt.Errorf("%w: worker %s event %d, last applied %d", ErrDuplicate, ws.key, ev.ID, ws.lastID)
		case ev.ID > ws.lastID+1:
			ix.stats.gaps.Add(1)
			return &GapError{Worker: ws.key, Want: ws.lastID + 1, Got: ev.ID}
		}
	}
	if ev.ID != 0 {
		ws.lastID, ws.sequenced = ev.ID, true
	}
	ws.lastUpdate.Store(ix.clock.Now().UnixNano())
	ix.stats.applied.Add(1)
	switch ev.Kind {
	case kvroute.EventStored:
		return ix.applyStored(ws, ev)
	case kvroute.EventRemoved:
		for _, h := range ev.Removed {
			ix.removeBlock(ws, h, ev.Tier)
		}
	case kvroute.EventCleared:
		ix.clearWorker(ws)
	}
	return nil
}

func (ix *Index) applyStored(ws *workerState, ev *kvroute.Event) error {
	var parent kvroute.SeqHash
	hasParent := ev.HasParent
	if hasParent {
		e, ok := ws.blocks.get(ev.Parent)
		if !ok {
			ix.stats.unknownParents.Add(1)
			err := &UnknownParentError{Worker: ws.key, Parent: ev.Parent, EventID: ev.ID}
			ix.log.Debug("stored event rejected", "err", err)
			return err
		}
		parent = e.seq
	}
	h := ix.hasher
	if ev.LoRA != "" {
		h = h.WithLoRA(ev.LoRA)
	}
	st := storer{ix: ix, ws: ws, tier: ev.Tier, prev: parent, hasPrev: hasParent}
	for i := range ev.Blocks {
		b := &ev.Blocks[i]
		local := b.Hash
		if len(b.Tokens) > 0 {
			local = h.HashBlock(b.Tokens)
		}
		st.store(b.External, local, len(ev.Blocks)-i)
	}
	st.flush()
	return nil
}

// storer stores the blocks of one Stored event, a chain, for one worker in
// one tier. Blocks the index already has are collected into ranges of one
// node and given the worker's bit a range at a time; new blocks are
// appended to a run the worker alone holds or start a new one.
type storer struct {
	ix      *Index
	ws      *workerState
	tier    kvroute.Tier
	prev    kvroute.SeqHash // the parent of the next block
	hasPrev bool

	// pending is a range [from, to) of existing blocks of node pend that
	// the worker is to hold.
	pend     *node
	from, to int
	// tail is the node the next new block may be appended to (its last
	// block is prev and the worker alone holds it), or nil.
	tail *node
}

// store stores one block, known to the engine as ext; left is the number
// of blocks of the event from this one on.
func (st *storer) store(ext kvroute.ExternalHash, local kvroute.BlockHash, left int) {
	seq := kvroute.SeqHash(local)
	if st.hasPrev {
		seq = kvroute.NextSeqHash(st.prev, local)
	}
	st.place(ext, seq, local, left)
	st.prev, st.hasPrev = seq, true
}

func (st *storer) place(ext kvroute.ExternalHash, seq kvroute.SeqHash, local kvroute.BlockHash, left int) {
	ix, ws, t := st.ix, st.ws, st.tier
	old, had := ws.blocks.get(ext)
	if had && old.seq != seq {
		// The engine reused its hash for other content: forget the old block.
		st.flush()
		for tt := kvroute.Tier(0); tt < kvroute.NumTiers; tt++ {
			if old.tiers&(1<<tt) != 0 {
				ix.removeBlock(ws, ext, tt)
			}
		}
		old, had = entry{}, false
		st.tail = nil
	}
	if had && old.tiers&(1<<t) != 0 {
		st.flush()
		st.tail = nil
		return
	}
	if !had {
		ix.entryCount.Add(1)
	}
	ws.blocks.put(ext, entry{seq: seq, tiers: old.tiers | 1<<t})

	n, off, ok := ix.blocks.get(seq)
	if ok {
		st.tail = nil
		if n.tiersOf(ws.slot)&(1<<t) != 0 {
			// Another engine hash of this worker already holds the block
			// in this tier; remember it so that removing one keeps the bit.
			st.flush()
			if ws.dups == nil {
				ws.dups = make(map[dupKey]int)
			}
			ws.dups[dupKey{seq, t}]++
			return
		}
		if st.pend == n && st.to == off {
			st.to++
			return
		}
		st.flush()
		st.pend, st.from, st.to = n, off, off+1
		return
	}
	st.flush()
	if st.tail == nil && st.hasPrev {
		st.tail = ix.appendable(st.prev, ws.slot, t)
	}
	if n := st.tail; n != nil && int(n.written) < len(n.seqs) {
		i := int(n.written)
		n.seqs[i], n.locals[i] = seq, local
		n.written++
		n.hi.Store(n.written)
		ix.blocks.put(seq, n, i)
		ix.pairCount.Add(1)
		return
	}
	capacity := max(left, minRun)
	if st.tail != nil {
		capacity = max(capacity, min(2*len(st.tail.seqs), maxRun))
	}
	n = ix.newNode(capacity, st.prev, st.hasPrev)
	n.seqs[0], n.locals[0] = seq, local
	n.written = 1
	n.hi.Store(1)
	ix.setTier(n, ws.slot, t)
	ix.blocks.put(seq, n, 0)
	st.tail = n
}

// Runs start with room for minRun blocks (or the event's remaining blocks)
// and a run extended block by block doubles its successor's room up to
// maxRun.
const (
	minRun = 4
	maxRun = 1024
)

// appendable returns the node whose last block is seq when slot alone
// holds it, in tier t only, and blocks may be appended after it.
func (ix *Index) appendable(seq kvroute.SeqHash, slot int, t kvroute.Tier) *node {
	n, off, ok := ix.blocks.get(seq)
	if !ok || off != int(n.written)-1 || n.hi.Load() != n.written || !n.heldOnlyBy(slot, t) {
		return nil
	}
	return n
}

// flush gives the worker the pending range.
func (st *storer) flush() {
	if st.pend == nil {
		return
	}
	n := st.ix.isolate(st.pend, st.from, st.to)
	st.ix.setTier(n, st.ws.slot, st.tier)
	st.pend = nil
}

func (ix *Index) newNode(capacity int, parent kvroute.SeqHash, hasParent bool) *node {
	ix.nodeCount.Add(1)
	ix.nodeBytes.Add(nodeHeaderBytes + 16*int64(capacity))
	return newNode(capacity, parent, hasParent)
}

// retire accounts for a node that left the tree.
func (ix *Index) retire(n *node) {
	ix.nodeCount.Add(-1)
	ix.nodeBytes.Add(-(nodeHeaderBytes + 16*int64(len(n.seqs))))
	ix.extraChunks.Add(-int64(n.extraChunks()))
	n.hi.Store(n.lo.Load()) // readers that still find it look again
}

// setTier gives slot tier t of every block of n.
func (ix *Index) setTier(n *node, slot int, t kvroute.Tier) {
	_, newHolder, added := n.setTier(slot, t)
	ix.extraChunks.Add(int64(added))
	if newHolder {
		ix.pairCount.Add(int64(n.size()))
	}
}

// isolate makes the blocks at positions [a, b) of n a node of their own,
// moving the blocks around them to new nodes with the same holders, and
// returns it. Of the ways to cut, it takes the one that moves the fewest
// blocks.
func (ix *Index) isolate(n *node, a, b int) *node {
	lo, hi := n.window()
	keepMiddle := (a - lo) + (hi - b)
	keepPrefix := (hi - a) + (hi - b)
	keepSuffix := (b - lo) + (a - lo)
	switch {
	case keepMiddle <= keepPrefix && keepMiddle <= keepSuffix:
		if a > lo {
			ix.splitPrefix(n, a)
		}
		if b < hi {
			ix.splitSuffix(n, b)
		}
		return n
	case keepPrefix <= keepSuffix:
		m := ix.splitSuffix(n, a)
		if b < hi {
			ix.splitSuffix(m, b-a)
		}
		return m
	default:
		p := ix.splitPrefix(n, b)
		if a > lo {
			ix.splitPrefix(p, a-lo)
		}
		return p
	}
}

// splitSuffix moves the blocks of n from position at on to a new node
// with n's holders and returns it. n keeps [lo, at) and can no longer be
// appended to.
func (ix *Index) splitSuffix(n *node, at int) *node {
	_, hi := n.window()
	parent, hasParent := n.parentOf(at)
	m := ix.newNode(hi-at, parent, hasParent)
	copy(m.seqs, n.seqs[at:hi])
	copy(m.locals, n.locals[at:hi])
	m.written = int32(hi - at)
	m.hi.Store(m.written)
	ix.extraChunks.Add(int64(m.copyHolders(n)))
	for i, s := range m.seqs {
		ix.blocks.put(s, m, i)
	}
	n.hi.Store(int32(at))
	return m
}

// splitPrefix moves the blocks of n before position at to a new node with
// n's holders and returns it. n keeps [at, hi).
func (ix *Index) splitPrefix(n *node, at int) *node {
	lo, _ := n.window()
	parent, hasParent := n.parentOf(lo)
	p := ix.newNode(at-lo, parent, hasParent)
	copy(p.seqs, n.seqs[lo:at])
	copy(p.locals, n.locals[lo:at])
	p.written = int32(at - lo)
	p.hi.Store(p.written)
	ix.extraChunks.Add(int64(p.copyHolders(n)))
	for i, s := range p.seqs {
		ix.blocks.put(s, p, i)
	}
	n.lo.Store(int32(at))
	return p
}

// removeBlock drops tier t of the block ws holds as ext.
func (ix *Index) removeBlock(ws *workerState, ext kvroute.ExternalHash, t kvroute.Tier) {
	e, ok := ws.blocks.get(ext)
	if !ok || e.tiers&(1<<t) == 0 {
		ix.stats.unknownRemoved.Add(1)
		return
	}
	e.tiers &^= 1 << t
	if e.tiers == 0 {
		ws.blocks.del(ext)
		ix.entryCount.Add(-1)
	} else {
		ws.blocks.put(ext, e)
	}
	dk := dupKey{e.seq, t}
	if c := ws.dups[dk]; c > 0 {
		if c == 1 {
			delete(ws.dups, dk)
		} else {
			ws.dups[dk] = c - 1
		}
		return
	}
	n, off, ok := ix.blocks.get(e.seq)
	if !ok {
		return
	}
	ix.unhold(n, off, off+1, ws.slot, t)
}

// unhold drops slot's tier t from the blocks at positions [a, b) of n,
// which slot holds in t.
func (ix *Index) unhold(n *node, a, b, slot int, t kvroute.Tier) {
	lo, hi := n.window()
	if n.heldOnlyBy(slot, t) && (a == lo || b == hi) {
		// The blocks leave the index: narrow the window instead of
		// splitting the run.
		for i := a; i < b; i++ {
			ix.blocks.del(n.seqs[i])
		}
		ix.pairCount.Add(-int64(b - a))
		switch {
		case a == lo && b == hi:
			n.clearTier(slot, t)
			ix.retire(n)
		case a == lo:
			n.lo.Store(int32(b))
		default:
			n.hi.Store(int32(a))
		}
		return
	}
	n = ix.isolate(n, a, b)
	if _, gone := n.clearTier(slot, t); gone {
		ix.pairCount.Add(-int64(n.size()))
	}
	if n.holders == 0 {
		lo, hi := n.window()
		for i := lo; i < hi; i++ {
			ix.blocks.del(n.seqs[i])
		}
		ix.retire(n)
	}
}

// clearWorker drops every block ws holds.
func (ix *Index) clearWorker(ws *workerState) {
	ws.blocks.all(func(ext kvroute.ExternalHash, e entry) {
		for t := kvroute.Tier(0); t < kvroute.NumTiers; t++ {
			if e.tiers&(1<<t) == 0 {
				continue
			}
			if c := ws.dups[dupKey{e.seq, t}]; c > 0 {
				ws.dups[dupKey{e.seq, t}] = c - 1
				continue
			}
			if n, off, ok := ix.blocks.get(e.seq); ok {
				ix.unhold(n, off, off+1, ws.slot, t)
			}
		}
	})
	ix.entryCount.Add(-int64(ws.blocks.len()))
	ws.blocks.reset()
	clear(ws.dups)
}

// ResetWorker drops every block w holds and forgets its event sequence, so
// that the next sequenced event is accepted as a new baseline. Use it when
// an engine restarted or events were lost beyond replay. The worker stays
// known to the index. Unknown workers are ignored.
func (ix *Index) ResetWorker(w kvroute.WorkerKey) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ws := ix.worker(w, false)
	if ws == nil {
		return
	}
	ix.clearWorker(ws)
	ws.lastID, ws.sequenced = 0, false
}

// RemoveWorker drops w and every block it holds from the index and reports
// whether it was known. Events for w that arrive later register it anew.
func (ix *Index) RemoveWorker(w kvroute.WorkerKey) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ws := ix.worker(w, false)
	if ws == nil {
		return false
	}
	ix.clearWorker(ws)
	ix.workers.Delete(w)
	ix.freeSlot(ws.slot)
	return true
}

// LastEventID returns the ID of the last sequenced event applied for w, and
// false when w is unknown or has applied no sequenced event since it was
// added or reset.
func (ix *Index) LastEventID(w kvroute.WorkerKey) (uint64, bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ws := ix.worker(w, false)
	if ws == nil {
		return 0, false
	}
	return ws.lastID, ws.sequenced
}

// LastUpdate returns when an event of w was last applied, and false when
// w is unknown or has applied none. Cost functions use it to discount the
// overlap of workers whose events stopped coming (scheduling.StalenessCost).
// It takes no lock.
func (ix *Index) LastUpdate(w kvroute.WorkerKey) (time.Time, bool) {
	ws, ok := ix.workers.Load(w)
	if !ok {
		return time.Time{}, false
	}
	ns := ws.lastUpdate.Load()
	if ns == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}

// Workers returns the known cache domains, sorted.
func (ix *Index) Workers() []kvroute.WorkerKey {
	var out []kvroute.WorkerKey
	ix.workers.Range(func(k kvroute.WorkerKey, _ *workerState) bool {
		out = append(out, k)
		return true
	})
	slices.SortFunc(out, compareKeys)
	return out
}

func compareKeys(a, b kvroute.WorkerKey) int {
	if c := cmp.Compare(a.ID, b.ID); c != 0 {
		return c
	}
	return cmp.Compare(a.Rank, b.Rank)
}

// AppendWorkerBlocks appends the sequence hashes of the blocks w holds, in
// any tier, to dst, in no particular order.
func (ix *Index) AppendWorkerBlocks(w kvroute.WorkerKey, dst []kvroute.SeqHash) []kvroute.SeqHash {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ws := ix.worker(w, false)
	if ws == nil {
		return dst
	}
	seen := make(map[kvroute.SeqHash]struct{}, ws.blocks.len())
	ws.blocks.all(func(_ kvroute.ExternalHash, e entry) {
		if _, ok := seen[e.seq]; !ok {
			seen[e.seq] = struct{}{}
			dst = append(dst, e.seq)
		}
	})
	return dst
}

// Stats are the index's event counters since it was created.
type Stats struct {
	Applied        uint64 // events applied (including those with unknown parents)
	Duplicates     uint64 // events rejected as duplicates
	Gaps           uint64 // events rejected for a gap
	UnknownParents uint64 // Stored events whose parent was unknown
	UnknownRemoved uint64 // removed blocks the worker did not hold
	Invalid        uint64 // malformed events
}

// Stats returns the event counters.
func (ix *Index) Stats() Stats {
	return Stats{
		Applied:        ix.stats.applied.Load(),
		Duplicates:     ix.stats.duplicates.Load(),
		Gaps:           ix.stats.gaps.Load(),
		UnknownParents: ix.stats.unknownParents.Load(),
		UnknownRemoved: ix.stats.unknownRemoved.Load(),
		Invalid:        ix.stats.invalid.Load(),
	}
}

// Size describes how much the index holds.
type Size struct {
	Workers int // known cache domains
	Blocks  int // distinct blocks (prefix-tree nodes)
	Pairs   int // (block, worker) pairs, whatever the tiers
	Entries int // (engine hash, worker) entries
	// Bytes estimates the memory the index uses, from the sizes of its
	// structures: nodes, holder-set chunks, map slots and per-worker
	// entries. Benchmarks check it against the Go heap.
	Bytes int64
}

// Approximate per-item memory costs used by Size.Bytes.
const (
	nodeHeaderBytes = 128 // node struct, rounded to its allocation size class
	chunkBytes      = 48  // one extra holder chunk
	entryBytes      = 40  // engine-hash map slot (24 bytes) at its average load
	workerBytes     = 512
)

// Size returns the index's current size.
func (ix *Index) Size() Size {
	s := Size{
		Workers: ix.workers.Size(),
		Blocks:  ix.blocks.len(),
		Pairs:   int(ix.pairCount.Load()),
		Entries: int(ix.entryCount.Load()),
	}
	s.Bytes = ix.nodeBytes.Load() + ix.blocks.bytes() + ix.extraChunks.Load()*chunkBytes +
		int64(s.Entries)*entryBytes + int64(s.Workers)*workerBytes
	return s
}
