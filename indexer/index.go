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
// The blocks form a prefix tree, stored as a concurrent hash map from
// sequence hash to node (xsync.MapOf): a node's key already names its whole
// path from the root, so matching a prompt is one map lookup per block and
// never walks the tree. Each node carries a bit set of worker slots per
// tier; worker identities are interned into dense slots so that these sets
// are a few machine words, not maps.
//
// Concurrency: Match, Size, Stats and the other read methods take no lock
// and may run on any number of goroutines while events are applied; they
// see each block's holder set as of some moment during the call. Apply,
// ResetWorker and RemoveWorker serialise per worker (a mutex per worker), so
// events of different workers may be applied concurrently. The caller
// applies one worker's events in order.
type Index struct {
	hasher kvroute.Hasher
	log    *slog.Logger
	clock  kvroute.Clock

	nodes *nodeTable

	// workers maps each known cache domain to its state.
	workers *xsync.MapOf[kvroute.WorkerKey, *workerState]

	// slotMu protects freeSlots and the publication of slotKeys.
	slotMu    sync.Mutex
	freeSlots []int
	// slotKeys is an immutable slice indexed by slot, republished whenever
	// a slot is taken or freed; Match reads it without a lock.
	slotKeys atomic.Pointer[[]slotKey]

	nodeCount    atomic.Int64 // nodes in the table, held or empty
	emptyNodes   atomic.Int64 // nodes in the table that nobody holds
	pairCount    atomic.Int64
	extraChunks  atomic.Int64
	entryCount   atomic.Int64
	stats        counters
	createWorker func(kvroute.WorkerKey) *workerState
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

// workerState is one cache domain's part of the index.
type workerState struct {
	key  kvroute.WorkerKey
	slot int

	// mu serialises the worker's writes and protects every field below.
	mu        sync.Mutex
	blocks    extMap
	dups      map[dupKey]int // extra engine hashes for one (block, tier); rare
	lastID    uint64
	sequenced bool
	removed   bool // set by RemoveWorker; a later event makes a new state

	// lastUpdate is when an event was last applied, unix ns; read without
	// the lock by LastUpdate.
	lastUpdate atomic.Int64
}

// entry is a block a worker holds, under the engine's hash for it.
type entry struct {
	n     *node
	tiers uint8 // bit t set: held in tier t
}

type dupKey struct {
	n    *node
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
		nodes:   newNodeTable(cfg.SizeHint),
		workers: xsync.NewMapOf[kvroute.WorkerKey, *workerState](),
	}
	empty := []slotKey{}
	ix.slotKeys.Store(&empty)
	ix.createWorker = ix.newWorker
	return ix, nil
}

// worker returns the state of w, creating it when create is set.
func (ix *Index) worker(w kvroute.WorkerKey, create bool) *workerState {
	if ws, ok := ix.workers.Load(w); ok || !create {
		return ws
	}
	ws, _ := ix.workers.LoadOrCompute(w, func() *workerState { return ix.createWorker(w) })
	return ws
}

func (ix *Index) newWorker(w kvroute.WorkerKey) *workerState {
	ws := &workerState{key: w, slot: ix.takeSlot(w), blocks: newExtMap()}
	return ws
}

func (ix *Index) takeSlot(w kvroute.WorkerKey) int {
	ix.slotMu.Lock()
	defer ix.slotMu.Unlock()
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

func (ix *Index) freeSlot(slot int) {
	ix.slotMu.Lock()
	defer ix.slotMu.Unlock()
	keys := slices.Clone(*ix.slotKeys.Load())
	keys[slot] = slotKey{}
	ix.freeSlots = append(ix.freeSlots, slot)
	ix.slotKeys.Store(&keys)
}

// lockLive returns the state of w locked, creating it when create is set;
// it skips a state that RemoveWorker retired while the caller waited.
func (ix *Index) lockLive(w kvroute.WorkerKey, create bool) *workerState {
	for {
		ws := ix.worker(w, create)
		if ws == nil {
			return nil
		}
		ws.mu.Lock()
		if !ws.removed {
			return ws
		}
		ws.mu.Unlock()
	}
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
	if err := ev.Validate(); err != nil {
		ix.stats.invalid.Add(1)
		// A malformed event in sequence is consumed, like one with an
		// unknown parent: replaying it would fail again, so the worker's
		// stream must go on past it.
		if ev.ID != 0 {
			if ws := ix.lockLive(ev.Worker, false); ws != nil {
				if !ws.sequenced || ev.ID == ws.lastID+1 {
					ws.lastID, ws.sequenced = ev.ID, true
				}
				ws.mu.Unlock()
			}
		}
		return err
	}
	ws := ix.lockLive(ev.Worker, true)
	defer ws.mu.Unlock()
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
	ix.beginWrite()
	defer ix.endWrite()
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

// beginWrite takes the node table's read lock for a batch of holder
// changes (see nodeTable); endWrite releases it and sweeps empty nodes out
// when they have piled up. Every caller of storeBlock, removeBlock and
// clearWorker brackets them so.
func (ix *Index) beginWrite() { ix.nodes.mu.RLock() }

func (ix *Index) endWrite() {
	ix.nodes.mu.RUnlock()
	if e := ix.emptyNodes.Load(); e > minSweep && e > (ix.nodeCount.Load()-e)/4 {
		ix.sweepEmpty()
	}
}

func (ix *Index) applyStored(ws *workerState, ev *kvroute.Event) error {
	var parent *node
	if ev.HasParent {
		e, ok := ws.blocks.get(ev.Parent)
		if !ok {
			ix.stats.unknownParents.Add(1)
			err := &UnknownParentError{Worker: ws.key, Parent: ev.Parent, EventID: ev.ID}
			ix.log.Debug("stored event rejected", "err", err)
			return err
		}
		parent = e.n
	}
	h := ix.hasher
	if ev.LoRA != "" {
		h = h.WithLoRA(ev.LoRA)
	}
	for i := range ev.Blocks {
		b := &ev.Blocks[i]
		local := b.Hash
		if len(b.Tokens) > 0 {
			local = h.HashBlock(b.Tokens)
		}
		parent = ix.storeBlock(ws, b.External, local, parent, ev.Tier)
	}
	return nil
}

// storeBlock records that ws holds the block local under parent in tier t,
// known to the engine as ext, and returns the block's node. ws.mu is held.
func (ix *Index) storeBlock(ws *workerState, ext kvroute.ExternalHash, local kvroute.BlockHash, parent *node, t kvroute.Tier) *node {
	seq := kvroute.SeqHash(local)
	if parent != nil {
		seq = kvroute.NextSeqHash(parent.seq, local)
	}
	old, had := ws.blocks.get(ext)
	if had && old.n.seq != seq {
		// The engine reused its hash for other content: forget the old block.
		for tt := kvroute.Tier(0); tt < kvroute.NumTiers; tt++ {
			if old.tiers&(1<<tt) != 0 {
				ix.removeBlock(ws, ext, tt)
			}
		}
		old, had = entry{}, false
	}
	if had && old.tiers&(1<<t) != 0 {
		return old.n
	}
	n, changed := ix.hold(seq, local, parent, ws.slot, t)
	if !changed {
		// Another engine hash of this worker already holds the block in
		// this tier; remember it so that removing one keeps the bit.
		if ws.dups == nil {
			ws.dups = make(map[dupKey]int)
		}
		ws.dups[dupKey{n, t}]++
	}
	if !had {
		ix.entryCount.Add(1)
	}
	ws.blocks.put(ext, entry{n: n, tiers: old.tiers | 1<<t})
	return n
}

// hold records that slot holds the block seq (content local, child of
// parent) in tier t, creating its node when needed, and returns the node
// and whether the slot's bit for t changed. The caller holds the table's
// read lock (beginWrite): an existing node is updated under it, in
// parallel with other workers; a new one is inserted under the write lock.
func (ix *Index) hold(seq kvroute.SeqHash, local kvroute.BlockHash, parent *node, slot int, t kvroute.Tier) (*node, bool) {
	tab := ix.nodes
	if s := tab.find(seq); s != nil {
		if n := s.node.Load(); n != nil {
			return n, ix.setBit(s, n, slot, t)
		}
	}
	// Insert under the write lock, then resume the caller's read lock.
	tab.mu.RUnlock()
	defer tab.mu.RLock()
	tab.mu.Lock()
	defer tab.mu.Unlock()
	n := &node{seq: seq, local: local, parent: parent}
	if parent != nil {
		n.depth = parent.depth + 1
	}
	s, inserted := tab.insert(n)
	if inserted {
		// A new node is empty until setBit below gives it its holder.
		ix.nodeCount.Add(1)
		ix.emptyNodes.Add(1)
	} else {
		n = s.node.Load()
	}
	return n, ix.setBit(s, n, slot, t)
}

// setBit sets slot's bit for tier t on n and its table slot s, and reports
// whether it changed. Only the slot's own worker changes its bits, so the
// node's words and the slot's mirrors agree once it returns.
func (ix *Index) setBit(s *slot, n *node, slot int, t kvroute.Tier) bool {
	c, added := n.growChunkFor(slot)
	if added > 0 {
		ix.extraChunks.Add(int64(added))
	}
	bit := uint64(1) << (slot % slotsPerChunk)
	heldBefore := c.any()&bit != 0
	if c.tiers[t].Or(bit)&bit != 0 {
		return false
	}
	if slot < slotsPerChunk {
		s.any0.Or(bit)
		if t == kvroute.TierDevice {
			s.dev0.Or(bit)
		}
	}
	if !heldBefore {
		ix.pairCount.Add(1)
		if n.holders.Add(1) == 1 {
			ix.emptyNodes.Add(-1)
		}
	}
	return true
}

// unholdNode clears ws's bit for tier t on n. ws.mu and the table's read
// lock are held.
//
// A node nobody holds stays in the table, empty, so that the common engine
// pattern of evicting a block and storing it again soon costs two atomic
// operations instead of a delete and an insert; Match treats an empty node
// like a missing one. Empty nodes are swept out in bulk once they exceed a
// quarter of the held ones (sweepEmpty).
func (ix *Index) unholdNode(ws *workerState, n *node, t kvroute.Tier) {
	c := n.chunkFor(ws.slot)
	if c == nil {
		return
	}
	bit := uint64(1) << (ws.slot % slotsPerChunk)
	s := ix.nodes.find(n.seq)
	if s != nil && s.node.Load() != n {
		s = nil // n left the table already (cannot while ws holds it)
	}
	if c.tiers[t].And(^bit)&bit != 0 {
		stillHeld := c.any()&bit != 0
		if s != nil && ws.slot < slotsPerChunk {
			if t == kvroute.TierDevice {
				s.dev0.And(^bit)
			}
			if !stillHeld {
				s.any0.And(^bit)
			}
		}
		if !stillHeld {
			ix.pairCount.Add(-1)
			if n.holders.Add(-1) == 0 {
				ix.emptyNodes.Add(1)
			}
		}
	}
}

// minSweep is the number of empty nodes below which they are never swept.
const minSweep = 1024

// sweepEmpty deletes every node nobody holds from the table.
func (ix *Index) sweepEmpty() {
	tab := ix.nodes
	tab.mu.Lock()
	defer tab.mu.Unlock()
	e := ix.emptyNodes.Load()
	if e <= minSweep || e <= (ix.nodeCount.Load()-e)/4 {
		return // another writer swept meanwhile
	}
	swept := tab.sweep(func(n *node) bool { return n.holders.Load() == 0 })
	for _, n := range swept {
		ix.extraChunks.Add(-int64(n.extraChunks()))
	}
	ix.nodeCount.Add(-int64(len(swept)))
	ix.emptyNodes.Add(-int64(len(swept)))
}

// removeBlock drops tier t of the block ws holds as ext. ws.mu is held.
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
	dk := dupKey{e.n, t}
	if c := ws.dups[dk]; c > 0 {
		if c == 1 {
			delete(ws.dups, dk)
		} else {
			ws.dups[dk] = c - 1
		}
		return
	}
	ix.unholdNode(ws, e.n, t)
}

// clearWorker drops every block ws holds. ws.mu is held.
func (ix *Index) clearWorker(ws *workerState) {
	ws.blocks.all(func(_ kvroute.ExternalHash, e entry) {
		for t := kvroute.Tier(0); t < kvroute.NumTiers; t++ {
			if e.tiers&(1<<t) != 0 {
				ix.unholdNode(ws, e.n, t)
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
	ws := ix.lockLive(w, false)
	if ws == nil {
		return
	}
	defer ws.mu.Unlock()
	ix.beginWrite()
	ix.clearWorker(ws)
	ix.endWrite()
	ws.lastID, ws.sequenced = 0, false
}

// RemoveWorker drops w and every block it holds from the index and reports
// whether it was known. Events for w that arrive later register it anew.
func (ix *Index) RemoveWorker(w kvroute.WorkerKey) bool {
	ws := ix.lockLive(w, false)
	if ws == nil {
		return false
	}
	ix.beginWrite()
	ix.clearWorker(ws)
	ix.endWrite()
	ws.removed = true
	ix.workers.Delete(w)
	ws.mu.Unlock()
	ix.freeSlot(ws.slot)
	return true
}

// LastEventID returns the ID of the last sequenced event applied for w, and
// false when w is unknown or has applied no sequenced event since it was
// added or reset.
func (ix *Index) LastEventID(w kvroute.WorkerKey) (uint64, bool) {
	ws := ix.lockLive(w, false)
	if ws == nil {
		return 0, false
	}
	defer ws.mu.Unlock()
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
	ws := ix.lockLive(w, false)
	if ws == nil {
		return dst
	}
	defer ws.mu.Unlock()
	seen := make(map[*node]struct{}, ws.blocks.len())
	ws.blocks.all(func(_ kvroute.ExternalHash, e entry) {
		if _, ok := seen[e.n]; !ok {
			seen[e.n] = struct{}{}
			dst = append(dst, e.n.seq)
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
	nodeBytes    = 80      // node struct, rounded to its allocation size class
	nodeMapBytes = 16 + 18 // xsync entry (key, pointer) plus its share of a bucket at load factor 0.75
	chunkBytes   = 48      // one extra holder chunk
	entryBytes   = 40      // Go map slot (8-byte key, 16-byte value) with control bytes and load factor
	workerBytes  = 512
)

// Size returns the index's current size.
func (ix *Index) Size() Size {
	s := Size{
		Workers: ix.workers.Size(),
		Blocks:  int(ix.nodeCount.Load() - ix.emptyNodes.Load()),
		Pairs:   int(ix.pairCount.Load()),
		Entries: int(ix.entryCount.Load()),
	}
	s.Bytes = ix.nodeCount.Load()*nodeBytes + ix.nodes.bytes() + ix.extraChunks.Load()*chunkBytes +
		int64(s.Entries)*entryBytes + int64(s.Workers)*workerBytes
	return s
}
