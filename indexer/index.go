package indexer

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"math"
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
	// WorkerBlocks is the number of blocks one cache domain is expected
	// to hold: the engines' KV cache capacity in blocks, per data-parallel
	// rank. Each domain's map from engine hashes to blocks starts with room
	// for that many, so that filling a cache does not rebuild the map at
	// every step of its growth; it still grows past it. ReserveWorker
	// sets the room of one domain. Zero means start small.
	WorkerBlocks int
	// Clock timestamps applied events (LastUpdate). Nil means the system
	// clock.
	Clock kvroute.Clock
}

// Index is the cluster prefix index: for every block (a token prefix named
// by its chained sequence hash) it records which cache domains hold it, and
// in which storage tiers.
//
// The blocks form a compressed radix tree of runs: chains of blocks at
// fixed positions in contiguous memory, each position pointing at the set
// of workers that hold it, shared by every position with the same holders
// (see the package documentation). A request is matched by about one table
// lookup per run and a contiguous comparison, not one lookup per block.
// Worker identities are interned into dense slots so that holder sets are
// a few machine words. Evicting a block in the middle of a chain drops only
// that block: no block any worker still holds is lost.
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
	// workers' engine-hash maps and sequence numbers, the runs' writer
	// fields, freeSlots.
	mu     sync.Mutex
	blocks *blockTable
	// arena holds the segments, to which runs' positions refer.
	arena segArena

	// workers maps each known cache domain to its state; LastUpdate reads
	// it without mu.
	workers *xsync.MapOf[kvroute.WorkerKey, *workerState]

	freeSlots []int
	// workerBlocks is Config.WorkerBlocks; reserved holds ReserveWorker's
	// rooms for domains that may have no state yet.
	workerBlocks int
	reserved     map[kvroute.WorkerKey]int
	// slotKeys is an immutable slice indexed by slot, republished whenever
	// a slot is taken or freed; Match reads it without a lock.
	slotKeys atomic.Pointer[[]slotKey]

	// parents holds the parents of heads, so that a block appended under
	// a parent is looked up in the table only when it may exist as a head.
	parents parentFilter

	// runs are the runs with live blocks by id; entries name runs by id.
	runs     []*run
	freeRuns []uint32
	// deadHeads counts the positions of the runs whose dead starts are
	// in the table; keptHeads is how many of them the last sweep kept
	// (the starts of runs with live positions stay).
	deadHeads, keptHeads int
	// sweepDue is set when the dead run starts are to be swept when the
	// write ends.
	sweepDue bool
	// sweepMin is the number of positions of dead runs kept for revival
	// below which they are never swept (minSweep; tests lower it).
	sweepMin int

	// sz is the writer's count of what the index holds, kept in plain
	// fields under mu and published to pub when the lock is released, so
	// that a write costs no atomic store per block.
	sz  sizes
	pub publishedSizes
	// unpub are the runs with positions written since the lock was taken
	// and not yet published (see run).
	unpub []*run
	// taken is removeBlocks' scratch space.
	taken []entry
	stats counters
}

// sizes are the index's size counters.
type sizes struct {
	runs     int64 // runs with live blocks
	runBytes int64 // memory of those runs' arrays
	segs     int64 // live segments
	blocks   int64 // live blocks
	pairs    int64 // (block, worker) pairs
	chunks   int64 // holder chunks after the embedded ones
	entries  int64 // (engine hash, worker) entries
}

// publishedSizes are the counters as of the last write, for the
// lock-free readers (Size).
type publishedSizes struct {
	last                                                 sizes
	runs, runBytes, segs, blocks, pairs, chunks, entries atomic.Int64
}

// unlock publishes the positions written and the size counters, and
// releases the write lock.
func (ix *Index) unlock() {
	if ix.sweepDue {
		ix.sweepDue = false
		ix.sweepDeadHeads()
	}
	for _, r := range ix.unpub {
		publishInt32(&r.pub, r.written)
	}
	clear(ix.unpub)
	ix.unpub = ix.unpub[:0]
	if p := &ix.pub; p.last != ix.sz {
		z := ix.sz
		publishInt64(&p.runs, z.runs)
		publishInt64(&p.runBytes, z.runBytes)
		publishInt64(&p.segs, z.segs)
		publishInt64(&p.blocks, z.blocks)
		publishInt64(&p.pairs, z.pairs)
		publishInt64(&p.chunks, z.chunks)
		publishInt64(&p.entries, z.entries)
		p.last = z
	}
	ix.mu.Unlock()
}

// slotKey is the worker a slot belongs to; ok is false for a free slot.
type slotKey struct {
	key kvroute.WorkerKey
	ok  bool
}

// counters are the event statistics, updated atomically.
type counters struct {
	applied, duplicates, gaps, unknownParents, repeated, unknownRemoved, invalid atomic.Uint64
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

// entry is a block a worker holds, under the engine's hash for it: its
// place (run id and position), which never changes while anyone holds the
// block, and its tiers.
type entry struct {
	id    uint32
	pos   int32 // below maxPos
	tiers uint8 // bit t set: held in tier t
}

// maxPos bounds a run's length, so that a position fits an entry.
const maxPos = 1 << 24

// place returns the run and position of e.
func (ix *Index) place(e entry) (*run, int) { return ix.runs[e.id], int(e.pos) }

// seqOf returns the sequence hash of the block of e.
func (ix *Index) seqOf(e entry) kvroute.SeqHash { return ix.runs[e.id].seqs[e.pos] }

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
		hasher:   h,
		log:      log,
		clock:    kvroute.ClockOrSystem(cfg.Clock),
		blocks:   newBlockTable(cfg.SizeHint / 16),
		workers:  xsync.NewMapOf[kvroute.WorkerKey, *workerState](),
		parents:  newParentFilter(0),
		sweepMin: minSweep,

		workerBlocks: max(cfg.WorkerBlocks, 0),
	}
	empty := []slotKey{}
	ix.slotKeys.Store(&empty)
	ix.arena.init()
	return ix, nil
}

// worker returns the state of w, creating it when create is set. ix.mu is
// held.
func (ix *Index) worker(w kvroute.WorkerKey, create bool) *workerState {
	if ws, ok := ix.workers.Load(w); ok || !create {
		return ws
	}
	ws := &workerState{key: w, slot: ix.takeSlot(w), blocks: newExtMap()}
	ws.blocks.reserve(ix.reservation(w))
	ix.workers.Store(w, ws)
	return ws
}

// reservation returns the blocks to make room for in w's map. ix.mu is
// held.
func (ix *Index) reservation(w kvroute.WorkerKey) int {
	if n, ok := ix.reserved[w]; ok {
		return n
	}
	return ix.workerBlocks
}

// ReserveWorker makes room in the index for cache domain w to hold blocks
// blocks, its KV cache capacity, as Config.WorkerBlocks does for every
// domain: for domains whose capacity differs from the rest or becomes
// known later (a router reserves what its workers report). The map from
// w's engine hashes to blocks grows to that size now, or when w's first
// event arrives, and does not shrink below it. A reservation is a size
// hint: w may hold more. blocks at or below zero cancel the reservation
// (Config.WorkerBlocks applies again); RemoveWorker cancels it too.
func (ix *Index) ReserveWorker(w kvroute.WorkerKey, blocks int) {
	ix.mu.Lock()
	defer ix.unlock()
	if blocks <= 0 {
		delete(ix.reserved, w)
	} else {
		if ix.reserved == nil {
			ix.reserved = make(map[kvroute.WorkerKey]int)
		}
		ix.reserved[w] = blocks
	}
	if ws := ix.worker(w, false); ws != nil {
		ws.blocks.reserve(ix.reservation(w))
	}
}

// Reservation returns the number of blocks the index has made room for
// in cache domain w (ReserveWorker, else Config.WorkerBlocks), zero when
// none.
func (ix *Index) Reservation(w kvroute.WorkerKey) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.reservation(w)
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
//     applied; drop it; its ID counts as seen when it is the next one of
//     the worker's sequence, and is ignored otherwise);
//   - ErrDuplicate when the ID is not newer than the worker's last (not
//     applied; drop it);
//   - a *GapError (matching ErrGap) when the ID skips events (not applied;
//     replay from GapError.Want, or ResetWorker and go on);
//   - an *UnknownParentError (matching ErrUnknownParent) when a Stored
//     event's parent is unknown for its worker (consumed, nothing attached);
//   - a *RepeatedBlockError (matching ErrRepeatedBlock) when a Stored
//     event's block names an engine hash the event named already, as its
//     parent or an earlier block (consumed: the blocks before that one
//     are stored, it and those after it are not; the worker keeps every
//     block it held).
//
// A worker's first sequenced event (ID not 0), and its first after
// ResetWorker, sets the baseline; IDs go on from there one at a time, and
// after math.MaxUint64 comes 1. Removing a block the worker does not hold
// is counted in Stats and is not an error. Apply does not retain ev or its
// slices.
func (ix *Index) Apply(ev *kvroute.Event) error {
	ix.mu.Lock()
	defer ix.unlock()
	if err := ev.Validate(); err != nil {
		ix.rejectInvalid(ev)
		return err
	}
	ws := ix.worker(ev.Worker, true)
	if ev.ID != 0 && ws.sequenced && ev.ID != ws.lastID+1 {
		if err := ix.outOfSequence(ws, ev.ID); err != nil {
			return err
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
		if len(ev.Removed) == 1 {
			ix.removeBlock(ws, ev.Removed[0], ev.Tier)
		} else {
			ix.removeBlocks(ws, ev.Removed, ev.Tier)
		}
	case kvroute.EventCleared:
		ix.clearWorker(ws)
	}
	return nil
}

func (ix *Index) applyStored(ws *workerState, ev *kvroute.Event) error {
	st := storer{ix: ix, ws: ws, tier: ev.Tier}
	if ev.HasParent {
		e, ok := ws.blocks.get(ev.Parent)
		if !ok {
			ix.stats.unknownParents.Add(1)
			err := &UnknownParentError{Worker: ws.key, Parent: ev.Parent, EventID: ev.ID}
			ix.log.Debug("stored event rejected", "err", err)
			return err
		}
		r, pos := ix.place(e)
		st.at(r.seqs[pos], r, pos)
	}
	h := ix.hasher
	if ev.LoRA != "" {
		h = h.WithLoRA(ev.LoRA)
	}
	st.ev = ev
	var err error
	for i := 0; i < len(ev.Blocks); {
		if st.hasPrev {
			if i += st.appendNew(ev.Blocks[i:], h); i == len(ev.Blocks) {
				break
			}
		}
		b := &ev.Blocks[i]
		st.cur = i
		if !st.store(b, h, len(ev.Blocks)-i) {
			ix.stats.repeated.Add(1)
			err = &RepeatedBlockError{Worker: ws.key, EventID: ev.ID, Block: b.External, Stored: i}
			ix.log.Debug("stored event cut short", "err", err)
			break
		}
		i++
	}
	st.flush()
	return err
}

// appendNew is store's fast path for the common case of an event's blocks
// that nobody holds yet, following their parent at the end of its run: it
// appends as many of blocks as it can to the parent's run, with one
// segment for all of them, and returns how many it stored. It stops at the
// first block that may exist already (the worker holds its engine hash,
// or a head may follow the parent), at the end of the run's room, or
// when the parent is not a live position of the worker's, and leaves that
// block to store.
func (st *storer) appendNew(blocks []kvroute.StoredBlock, h kvroute.Hasher) int {
	ix, ws, t := st.ix, st.ws, st.tier
	r, j := st.pr, st.pp+1
	if r == nil || j != int(r.written) || j >= len(r.seqs) || r.live == 0 {
		return 0
	}
	before := r.seg(j - 1)
	if before == nil {
		return 0
	}
	room := min(len(blocks), len(r.seqs)-j)
	prev := st.prev
	given := st.ev.SeqHashes // the blocks carry their sequence hashes
	var s *segment
	n := 0
	// New keys take their home slots when the maps outgrow the caches
	// (see extMap.upsertAt).
	home := ix.sz.entries*entryBytes >= uncachedMapBytes
	pf := home && ws.blocks.prefetching()
	// The loop's stores could alias the index's fields as far as the
	// compiler knows: what it reads of them every block is copied first.
	parents := ix.parents
	seqs, segs := r.seqs[j:j+room], r.segs[j:j+room]
	var ref uint64 // s.ref()
	for n < len(seqs) {
		if parents.mayHave(prev) {
			break // the block may be a head already
		}
		if pf && n+appendAhead < room {
			// The map slot a block appendAhead on will take is in
			// memory, not cached: ask for it now, so that its miss
			// overlaps this block's.
			ws.blocks.touchHome(blocks[n+appendAhead].External)
		}
		b := &blocks[n]
		p, had := ws.blocks.upsertAt(b.External, home)
		if had {
			break // store looks the hash up again and handles it
		}
		seq := kvroute.SeqHash(b.Hash)
		if !given {
			seq = kvroute.NextSeqHash(prev, contentHash(b, &h))
		}
		if s == nil {
			// The first new block: the pending range goes first, then
			// the new positions get the parent's segment when the
			// worker alone holds it in this tier only, else their own.
			st.flush()
			parents = ix.parents // flush may have added heads
			if before.heldOnlyBy(ws.slot, t) {
				s = before
			} else {
				s = ix.newSegment()
				_, added := s.setTier(ws.slot, t)
				ix.sz.chunks += int64(added)
			}
			if r.written == r.pub.Load() {
				ix.unpub = append(ix.unpub, r)
			}
			ref = s.ref()
		}
		seqs[n] = seq
		publishUint64(&segs[n], ref)
		*p = entry{id: r.id, pos: int32(j + n), tiers: 1 << t}.pack()
		prev = seq
		n++
	}
	if n == 0 {
		return 0
	}
	s.count += int32(n)
	r.written += int32(n)
	r.live += int32(n)
	ix.sz.entries += int64(n)
	ix.sz.blocks += int64(n)
	ix.sz.pairs += int64(n)
	st.at(prev, r, j+n-1)
	return n
}

// appendAhead is how many blocks ahead of the one it appends appendNew
// asks for the map lines of a new key (see extMap.touchHome).
const appendAhead = 8

// uncachedMapBytes is the memory of all engine-hash maps from which
// appendNew has new keys take their home slots: twice the second-level
// cache of a large core, beyond which a map's control words are rarely
// cached.
const uncachedMapBytes = 4 << 20

// storer stores the blocks of one Stored event, a chain, for one worker in
// one tier. It follows the chain through the runs: a block the index has
// is found at the position after its parent's or, when it branched off,
// as a head in the table; existing blocks are collected into ranges of one
// run and given the worker's bit a range at a time; new blocks are
// appended after their parent when it ends its run, or start a run.
type storer struct {
	ix   *Index
	ws   *workerState
	tier kvroute.Tier

	// prev is the parent of the next block, at position pp of run pr
	// (nil for none).
	prev    kvroute.SeqHash
	hasPrev bool
	pr      *run
	pp      int

	// pending is a range [from, to) of live positions of run pend that
	// the worker is to hold.
	pend     *run
	from, to int

	// ev is the Stored event being stored (nil for approximate inserts),
	// cur the index of its block being stored.
	ev  *kvroute.Event
	cur int
}

// at sets the parent of the next block.
func (st *storer) at(seq kvroute.SeqHash, r *run, pos int) {
	st.prev, st.hasPrev, st.pr, st.pp = seq, true, r, pos
}

// store stores block b of the event, hashed with h when it carries tokens;
// left is the number of blocks of the event from this one on. It reports
// false, storing nothing, when b's engine hash names the event's parent or
// one of its blocks before this one (see place).
func (st *storer) store(b *kvroute.StoredBlock, h kvroute.Hasher, left int) bool {
	return st.place(b.External, st.seqOf(b, h, st.prev), left)
}

// seqOf returns the sequence hash of block b of the event, a child of
// prev (of the root when the storer has no parent yet): b's own Hash when
// the event carries sequence hashes, else chained from its content hash,
// which h computes when b carries tokens.
func (st *storer) seqOf(b *kvroute.StoredBlock, h kvroute.Hasher, prev kvroute.SeqHash) kvroute.SeqHash {
	if st.ev.SeqHashes {
		return kvroute.SeqHash(b.Hash)
	}
	local := contentHash(b, &h)
	if !st.hasPrev {
		return kvroute.SeqHash(local)
	}
	return kvroute.NextSeqHash(prev, local)
}

// contentHash returns the content hash of block b: h's hash of its tokens
// when it carries them, else its Hash.
func contentHash(b *kvroute.StoredBlock, h *kvroute.Hasher) kvroute.BlockHash {
	if len(b.Tokens) > 0 {
		return h.HashBlock(b.Tokens)
	}
	return b.Hash
}

// place stores the block seq and moves the storer past it. It reports
// false, storing nothing, when the worker's engine hash ext names another
// block that is the event's parent or one of its blocks before this one:
// the block would be its own ancestor, which no engine stores, and taking
// ext over would drop a block the worker holds. Such a repeat can only
// show here, where ext names a block other than seq (the same block at
// two places of one chain would be a hash cycle), so the common path
// pays nothing for the check.
func (st *storer) place(ext kvroute.ExternalHash, seq kvroute.SeqHash, left int) bool {
	ix, ws, t := st.ix, st.ws, st.tier
	// One probe finds or inserts the entry; nothing below changes the map
	// before the entry is set.
	p, had := ws.blocks.upsert(ext)
	var old entry
	switch {
	case !had:
		ix.sz.entries += 1
	case ix.seqOf(unpack(*p)) != seq:
		if st.repeats(ext) {
			return false
		}
		// The engine reused its hash for other content: forget the old block.
		st.flush()
		stale := unpack(*p)
		r, pos := ix.place(stale)
		for tt := kvroute.Tier(0); tt < kvroute.NumTiers; tt++ {
			if stale.tiers&(1<<tt) != 0 {
				ix.release(ws, r, pos, tt)
			}
		}
	default:
		old = unpack(*p)
		if old.tiers&(1<<t) != 0 {
			r, pos := ix.place(old)
			st.at(seq, r, pos)
			return true
		}
	}
	r, pos := st.locate(seq, left)
	*p = entry{id: r.id, pos: int32(pos), tiers: old.tiers | 1<<t}.pack()
	st.at(seq, r, pos)
	return true
}

// repeats reports whether ext names the parent of the event being stored
// or one of its blocks before the current one.
func (st *storer) repeats(ext kvroute.ExternalHash) bool {
	ev := st.ev
	if ev == nil {
		return false
	}
	if ev.HasParent && ev.Parent == ext {
		return true
	}
	for i := range st.cur {
		if ev.Blocks[i].External == ext {
			return true
		}
	}
	return false
}

// locate finds the live place of block seq, a child of prev, and gives
// the worker the block there (now or at the next flush), or brings the
// block to life for the worker: at the position after its parent when
// that is free or holds it dead, or at the start of a new run.
func (st *storer) locate(seq kvroute.SeqHash, left int) (*run, int) {
	ix, slot, t := st.ix, st.ws.slot, st.tier
	pr, j := st.pr, st.pp+1
	revive := false
	if pr != nil && j < int(pr.written) && pr.seqs[j] == seq {
		if pr.alive(j) {
			return st.hold(pr, j)
		}
		revive = true
	}
	var dead *run // a dead run start holding the block, from the table
	if pr == nil || ix.parents.mayHave(st.prev) {
		if r, pos, ok := ix.blocks.get(seq); ok && r.seqs[pos] == seq {
			if r.alive(pos) {
				return st.hold(r, pos)
			}
			if pos == 0 {
				dead = r
			}
		}
	}
	st.flush()
	switch {
	case revive:
		ix.bringToLife(pr, j, slot, t)
		return pr, j
	case dead != nil:
		ix.bringToLife(dead, 0, slot, t)
		return dead, 0
	case pr != nil && j == int(pr.written) && j < len(pr.seqs):
		pr.seqs[j] = seq
		if pr.written == pr.pub.Load() {
			ix.unpub = append(ix.unpub, pr)
		}
		pr.written++
		ix.bringToLife(pr, j, slot, t)
		return pr, j
	}
	capacity := max(left, minRun)
	if left == 1 && pr != nil && j == int(pr.written) {
		// A chain growing a block at a time (as decoding fills blocks):
		// give each run twice the room of the last.
		capacity = max(capacity, min(2*len(pr.seqs), maxRun))
	}
	r := newRun(min(capacity, maxPos), st.prev, st.hasPrev, &ix.arena)
	r.up, r.upPos = pr, int32(st.pp)
	r.seqs[0] = seq
	r.written = 1
	ix.unpub = append(ix.unpub, r)
	ix.bringToLife(r, 0, slot, t)
	return r, 0
}

// hold gives the worker the live block at pos of r, or counts another
// engine hash for it when the worker holds it in the tier already.
func (st *storer) hold(r *run, pos int) (*run, int) {
	if s := r.seg(pos); s.tiersOf(st.ws.slot)&(1<<st.tier) != 0 {
		// Another engine hash of this worker already holds the block in
		// this tier; remember it so that removing one keeps the bit.
		ws := st.ws
		if ws.dups == nil {
			ws.dups = make(map[dupKey]int)
		}
		ws.dups[dupKey{r.seqs[pos], st.tier}]++
		return r, pos
	}
	if st.pend == r && st.to == pos {
		st.to++
		return r, pos
	}
	st.flush()
	st.pend, st.from, st.to = r, pos, pos+1
	return r, pos
}

// Runs start with room for the event's remaining blocks, at least minRun;
// a chain that grows a block per event doubles each run's room up to
// maxRun.
const (
	minRun = 4
	maxRun = 1024
)

// flush gives the worker the pending range.
func (st *storer) flush() {
	if st.pend == nil {
		return
	}
	st.ix.holdRange(st.pend, st.from, st.to, st.ws.slot, st.tier)
	st.pend = nil
}

// holdRange gives slot tier t of the live positions [a, b) of r.
func (ix *Index) holdRange(r *run, a, b, slot int, t kvroute.Tier) {
	for a < b {
		s := r.seg(a)
		y := a + 1
		for y < b && r.sameSeg(y, s) {
			y++
		}
		if had := s.tiersOf(slot); had&(1<<t) == 0 {
			ix.regroup(r, a, y, s, slot, t, true)
			if had == 0 {
				ix.sz.pairs += int64(y - a)
			}
		}
		a = y
	}
}

// regroup adds (add) or drops (!add) slot's tier t for the positions
// [a, b) of r, which all point at segment s, and returns their segment
// afterwards, nil when they died. When they are all of s, s changes in
// place; otherwise they move to a neighbour that already has the holders
// they need, or to a new segment. A drop that leaves some of s's
// positions with no holder never comes here: releaseRange settles it.
func (ix *Index) regroup(r *run, a, b int, s *segment, slot int, t kvroute.Tier, add bool) *segment {
	n := b - a
	var target *segment
	if int(s.count) == n {
		if add {
			_, added := s.setTier(slot, t)
			ix.sz.chunks += int64(added)
		} else {
			s.clearTier(slot, t)
		}
		if s.holders > 0 {
			// Join a neighbour with the same holders, if any.
			for _, nb := range [2]*segment{r.liveNeighbour(a-1, s), r.liveNeighbour(b, s)} {
				if nb != nil && sameHolders(nb, s) {
					ix.repoint(r, a, b, s, nb)
					return nb
				}
			}
			return s
		}
		// s is dead, and [a, b) are all its positions: they die with it
		// and refer to no segment, so that no position refers to s's
		// arena slot once s is freed and the slot given out again.
		for i := a; i < b; i++ {
			r.setSeg(i, nil)
		}
		ix.dropSegment(s)
		return nil
	}
	for _, nb := range [2]*segment{r.liveNeighbour(a-1, s), r.liveNeighbour(b, s)} {
		if nb != nil && holdersDiffer(nb, s, slot, t, add) {
			target = nb
			break
		}
	}
	if target == nil {
		target = ix.newSegment()
		ix.sz.chunks += int64(target.copyHolders(s))
		if add {
			_, added := target.setTier(slot, t)
			ix.sz.chunks += int64(added)
		} else {
			target.clearTier(slot, t)
		}
	}
	ix.repoint(r, a, b, s, target)
	return target
}

// repoint moves the positions [a, b) of r from segment s to target (nil:
// they die).
func (ix *Index) repoint(r *run, a, b int, s, target *segment) {
	for i := a; i < b; i++ {
		r.setSeg(i, target)
	}
	if target != nil {
		target.count += int32(b - a)
	}
	if s.count -= int32(b - a); s.count == 0 {
		ix.dropSegment(s)
	}
}

// newSegment returns a counted segment with no holders and no positions.
func (ix *Index) newSegment() *segment {
	ix.sz.segs += 1
	return ix.arena.alloc()
}

// dropSegment uncounts and frees s, to which no position refers any more.
func (ix *Index) dropSegment(s *segment) {
	ix.sz.segs += -1
	ix.sz.chunks += -int64(s.extraChunks())
	ix.arena.release(s)
}

// sameHolders reports whether a and b have the same holders in the same
// tiers.
func sameHolders(a, b *segment) bool {
	return a.holders == b.holders && allWords(a, b, func(_ int, _ kvroute.Tier, x, y uint64) bool { return x == y })
}

// holdersDiffer reports whether n has the holders of s with slot's tier t
// added (add) or removed (!add), and s does not have it (add) or has it
// (!add).
func holdersDiffer(n, s *segment, slot int, t kvroute.Tier, add bool) bool {
	if n.chunkFor(slot) == nil && s.chunkFor(slot) == nil {
		// Neither has slot's chunk, so neither has its bit: n does not
		// have it (add) or s does not (!add). allWords below stops at
		// the last chunk either has and would not look at slot's.
		return false
	}
	bit := uint64(1) << (slot % slotsPerChunk)
	return allWords(n, s, func(c int, tt kvroute.Tier, x, y uint64) bool {
		if tt == t && c == slot/slotsPerChunk {
			if (y&bit != 0) == add {
				return false
			}
			y ^= bit
		}
		return x == y
	})
}

// allWords reports whether ok holds for every pair of holder words of a
// and b, chunk by chunk and tier by tier (a missing chunk's words are 0).
func allWords(a, b *segment, ok func(chunk int, t kvroute.Tier, x, y uint64) bool) bool {
	x, y := &a.holder, &b.holder
	for c := 0; x != nil || y != nil; c++ {
		for t := range kvroute.NumTiers {
			var xv, yv uint64
			if x != nil {
				xv = x.tiers[t].Load()
			}
			if y != nil {
				yv = y.tiers[t].Load()
			}
			if !ok(c, kvroute.Tier(t), xv, yv) {
				return false
			}
		}
		if x != nil {
			x = x.next.Load()
		}
		if y != nil {
			y = y.next.Load()
		}
	}
	return true
}

// bringToLife makes the written, dead position i of r live, held by slot
// in tier t: it joins the segment of a neighbour that slot alone holds in
// t only, or gets a segment of its own.
func (ix *Index) bringToLife(r *run, i, slot int, t kvroute.Tier) {
	var s *segment
	before, after := r.seg(i-1), r.seg(i+1)
	switch {
	case before != nil && before.heldOnlyBy(slot, t):
		s = before
	case after != nil && after.heldOnlyBy(slot, t):
		s = after
	default:
		s = ix.newSegment()
		_, added := s.setTier(slot, t)
		ix.sz.chunks += int64(added)
	}
	s.count++
	r.setSeg(i, s)
	if r.live == 0 {
		ix.register(r)
	}
	r.live++
	ix.sz.blocks += 1
	ix.sz.pairs += 1
	if i == 0 {
		ix.addHead(r, 0)
	}
}

// register gives a run that comes to life an id.
func (ix *Index) register(r *run) {
	if n := len(ix.freeRuns); n > 0 {
		r.id = ix.freeRuns[n-1]
		ix.freeRuns = ix.freeRuns[:n-1]
		ix.runs[r.id] = r
	} else {
		r.id = uint32(len(ix.runs))
		ix.runs = append(ix.runs, r)
	}
	ix.sz.runs += 1
	ix.sz.runBytes += runHeaderBytes + runPosBytes*int64(len(r.seqs))
}

// addHead records that the live block at i of r, a run start, is a head.
func (ix *Index) addHead(r *run, i int) {
	ix.blocks.put(r.seqs[i], r, i)
	if p, ok := r.parentOf(i); ok {
		ix.parents.add(p)
		if ix.parents.full() {
			ix.rebuildParents()
		}
	}
}

// rebuildParents rebuilds the parent filter from the heads in the table.
func (ix *Index) rebuildParents() {
	f := newParentFilter(ix.blocks.len())
	ix.blocks.each(func(r *run, i int) {
		if p, ok := r.parentOf(i); ok {
			f.add(p)
		}
	})
	ix.parents = f
}

// died records that the positions [a, b) of r lost their last holder.
func (ix *Index) died(r *run, a, b int) {
	r.live -= int32(b - a)
	ix.sz.blocks -= int64(b - a)
	if a == 0 {
		// A dead run start stays in the table, so that storing the chain
		// again (engines evict prefixes and recompute them) brings the run
		// back to life instead of building a new one: a dead position is
		// found from its live parent, or from the table at a run start,
		// so no live block needs a table entry of its own when its
		// predecessor dies. Sweeps drop the entries of runs with no live
		// position once they hold a quarter as many positions as there
		// are live blocks. A sweep runs when the write ends, not here: a
		// Stored event that reuses an engine hash may release a block it
		// just placed and go on placing its children after it, which
		// brings the run back to life, so only the end of the write
		// tells which runs are dead.
		if ix.deadHeads += len(r.seqs); ix.deadHeads > ix.keptHeads+max(ix.sweepMin, int(ix.sz.blocks)/4) {
			ix.sweepDue = true
		}
	}
	if r.live == 0 {
		// No entry or head names the run any more: its id is free.
		ix.runs[r.id] = nil
		ix.freeRuns = append(ix.freeRuns, r.id)
		ix.sz.runs += -1
		ix.sz.runBytes += -(runHeaderBytes + runPosBytes*int64(len(r.seqs)))
	}
}

// minSweep is the number of positions of dead runs kept for revival
// below which they are never swept from the table.
const minSweep = 1 << 16

// sweepDeadHeads drops the table entries of the dead starts of runs with
// no live position. The starts of runs that still have live positions
// stay: their live blocks are found through them when the chain is
// stored again.
func (ix *Index) sweepDeadHeads() {
	var dead []kvroute.SeqHash
	kept := 0
	ix.blocks.each(func(r *run, i int) {
		switch {
		case r.alive(i):
		case r.live == 0:
			dead = append(dead, r.seqs[i])
		default:
			kept += len(r.seqs)
		}
	})
	for _, s := range dead {
		ix.blocks.del(s)
	}
	ix.deadHeads, ix.keptHeads = kept, kept
}

// removeBlock drops tier t of the block ws holds as ext.
func (ix *Index) removeBlock(ws *workerState, ext kvroute.ExternalHash, t kvroute.Tier) {
	if e, ok := ix.takeEntry(ws, ext, t); ok {
		r, pos := ix.place(e)
		ix.release(ws, r, pos, t)
	}
}

// removeBlocks drops tier t of the blocks ws holds as exts in two
// passes: the entries are taken out of the map while the map slots of the
// engine hashes a window ahead are touched, so that the CPU overlaps
// their cache misses, then the blocks are released, a range of
// neighbours sharing a segment at a time. (A pass between the two that
// touched every block's segment first cost 4% of a trace replay with LRU
// evictions and saved nothing with random ones, on a core with 2 MiB of
// second-level cache: the runs and segments are mostly cached.)
func (ix *Index) removeBlocks(ws *workerState, exts []kvroute.ExternalHash, t kvroute.Tier) {
	ws.blocks.prefetch(len(exts), func(i int) kvroute.ExternalHash { return exts[i] })
	taken := ix.taken[:0]
	touch := ws.blocks.prefetching()
	for i, h := range exts {
		if touch && i+prefetchAhead < len(exts) {
			ws.blocks.touch(exts[i+prefetchAhead])
		}
		if e, ok := ix.takeEntry(ws, h, t); ok {
			taken = append(taken, e)
		}
	}
	for k := 0; k < len(taken); {
		r, pos := ix.place(taken[k])
		k++
		if len(ws.dups) > 0 {
			ix.release(ws, r, pos, t)
			continue
		}
		// Engines evict a chain from its tail or its head: collect the
		// positions next to the range, in either order, that share its
		// segment, and release them together.
		s := r.seg(pos)
		if s == nil {
			continue
		}
		a, b := pos, pos+1
	collect:
		for k < len(taken) && taken[k].id == r.id {
			p := int(taken[k].pos)
			switch {
			case p == a-1 && r.sameSeg(p, s):
				a = p
			case p == b && r.sameSeg(p, s):
				b++
			default:
				break collect
			}
			k++
		}
		ix.releaseRange(ws, r, a, b, s, t)
	}
	clear(taken)
	ix.taken = taken[:0]
}

// takeEntry takes tier t off the entry of ext in ws's map, deleting the
// entry when it has no tier left, and returns the entry as it was; false
// when ws does not hold ext in t (counted in Stats).
func (ix *Index) takeEntry(ws *workerState, ext kvroute.ExternalHash, t kvroute.Tier) (entry, bool) {
	e, ok := ws.blocks.take(ext, 1<<t)
	if !ok {
		ix.stats.unknownRemoved.Add(1)
		return entry{}, false
	}
	if e.tiers == 1<<t {
		ix.sz.entries--
	}
	return e, true
}

// release drops ws's hold of the block at pos of r in tier t, unless
// another of its engine hashes still holds it.
func (ix *Index) release(ws *workerState, r *run, pos int, t kvroute.Tier) {
	if len(ws.dups) > 0 {
		// Reading the block's hash costs a cache miss; duplicates are
		// rare, so look only when the worker has any.
		dk := dupKey{r.seqs[pos], t}
		if c := ws.dups[dk]; c > 0 {
			if c == 1 {
				delete(ws.dups, dk)
			} else {
				ws.dups[dk] = c - 1
			}
			return
		}
	}
	if s := r.seg(pos); s != nil {
		ix.releaseRange(ws, r, pos, pos+1, s, t)
	}
}

// releaseRange drops ws's hold in tier t of the positions [a, b) of r,
// which share the live segment s; none of them is held under a duplicate
// engine hash of ws (see release). It is regroup's only caller that drops
// a tier.
func (ix *Index) releaseRange(ws *workerState, r *run, a, b int, s *segment, t kvroute.Tier) {
	had := s.tiersOf(ws.slot)
	if had&(1<<t) == 0 {
		return
	}
	if had == 1<<t {
		ix.sz.pairs -= int64(b - a)
		if s.holders == 1 && int(s.count) != b-a {
			// Some of the positions of the worker's own segment lose
			// their only holder (an engine evicting blocks from the
			// middle or the end of a chain only it holds). No live
			// neighbour can take them (it would have to hold nothing),
			// so none is read, and regroup, whose larger frame costs a
			// replay with random evictions about 4%, is not entered.
			ix.repoint(r, a, b, s, nil)
			ix.died(r, a, b)
			return
		}
	}
	if ix.regroup(r, a, b, s, ws.slot, t, false) == nil {
		ix.died(r, a, b)
	}
}

// clearWorker drops every block ws holds.
func (ix *Index) clearWorker(ws *workerState) {
	ws.blocks.all(func(_ kvroute.ExternalHash, e entry) {
		for t := kvroute.Tier(0); t < kvroute.NumTiers; t++ {
			if e.tiers&(1<<t) != 0 {
				r, pos := ix.place(e)
				ix.release(ws, r, pos, t)
			}
		}
	})
	ix.sz.entries += -int64(ws.blocks.len())
	ws.blocks.reset()
	clear(ws.dups)
}

// ResetWorker drops every block w holds and forgets its event sequence, so
// that the next sequenced event is accepted as a new baseline. Use it when
// an engine restarted or events were lost beyond replay. The worker stays
// known to the index. Unknown workers are ignored.
func (ix *Index) ResetWorker(w kvroute.WorkerKey) {
	ix.mu.Lock()
	defer ix.unlock()
	ws := ix.worker(w, false)
	if ws == nil {
		return
	}
	ix.clearWorker(ws)
	ws.lastID, ws.sequenced = 0, false
}

// RemoveWorker drops w and every block it holds from the index, cancels
// its reservation (ReserveWorker) and reports whether it was known.
// Events for w that arrive later register it anew.
func (ix *Index) RemoveWorker(w kvroute.WorkerKey) bool {
	ix.mu.Lock()
	defer ix.unlock()
	delete(ix.reserved, w)
	ws := ix.worker(w, false)
	if ws == nil {
		return false
	}
	ix.clearWorker(ws)
	ix.workers.Delete(w)
	ix.freeSlot(ws.slot)
	return true
}

// rejectInvalid counts the malformed event ev and consumes its ID when
// it is the next of its worker's established sequence: replaying it would
// fail again, so the worker's stream must go on past it, as past an event
// with an unknown parent. Its ID is trusted no further: taken as the
// baseline of an unsequenced worker, a garbled ID would make every later
// event of the worker a duplicate. ix.mu is held.
func (ix *Index) rejectInvalid(ev *kvroute.Event) {
	ix.stats.invalid.Add(1)
	if ev.ID == 0 {
		return
	}
	if ws := ix.worker(ev.Worker, false); ws != nil && ws.sequenced && ev.ID == nextID(ws.lastID) {
		ws.lastID = ev.ID
	}
}

// outOfSequence returns the error for event id of ws, sequenced, which is
// not lastID+1: ErrDuplicate for an ID up to the last, a *GapError for one
// ahead, and nil for 1 after the largest ID (the sequence goes on there).
// After the largest ID only the largest itself is a duplicate. ix.mu is
// held.
func (ix *Index) outOfSequence(ws *workerState, id uint64) error {
	want := nextID(ws.lastID)
	switch {
	case id == want:
		return nil
	case id <= ws.lastID && (ws.lastID != math.MaxUint64 || id == ws.lastID):
		ix.stats.duplicates.Add(1)
		return fmt.Errorf("%w: worker %s event %d, last applied %d", ErrDuplicate, ws.key, id, ws.lastID)
	}
	ix.stats.gaps.Add(1)
	return &GapError{Worker: ws.key, Want: want, Got: id}
}

// nextID returns the ID of the event after the one with ID last: last+1,
// and 1 after the largest ID (0 marks unsequenced events).
func nextID(last uint64) uint64 {
	if last == math.MaxUint64 {
		return 1
	}
	return last + 1
}

// LastEventID returns the ID of the last sequenced event applied for w, and
// false when w is unknown or has applied no sequenced event since it was
// added or reset.
func (ix *Index) LastEventID(w kvroute.WorkerKey) (uint64, bool) {
	ix.mu.Lock()
	defer ix.unlock()
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
	defer ix.unlock()
	ws := ix.worker(w, false)
	if ws == nil {
		return dst
	}
	seen := make(map[kvroute.SeqHash]struct{}, ws.blocks.len())
	ws.blocks.all(func(_ kvroute.ExternalHash, e entry) {
		if s := ix.seqOf(e); !hasKey(seen, s) {
			seen[s] = struct{}{}
			dst = append(dst, s)
		}
	})
	return dst
}

func hasKey[K comparable, V any](m map[K]V, k K) bool {
	_, ok := m[k]
	return ok
}

// Stats are the index's event counters since it was created.
type Stats struct {
	Applied        uint64 // events applied (including those with unknown parents or cut short)
	Duplicates     uint64 // events rejected as duplicates
	Gaps           uint64 // events rejected for a gap
	UnknownParents uint64 // Stored events whose parent was unknown
	Repeated       uint64 // Stored events cut short at a block naming an engine hash the event named already
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
		Repeated:       ix.stats.repeated.Load(),
		UnknownRemoved: ix.stats.unknownRemoved.Load(),
		Invalid:        ix.stats.invalid.Load(),
	}
}

// Size describes how much the index holds.
type Size struct {
	Workers int // known cache domains
	Blocks  int // distinct blocks held
	Pairs   int // (block, worker) pairs, whatever the tiers
	Entries int // (engine hash, worker) entries
	// Bytes estimates the memory the index uses, from the sizes of its
	// structures: runs, segments, holder-set chunks, table slots and per-worker
	// entries. Benchmarks check it against the Go heap.
	Bytes int64
}

// Approximate per-item memory costs used by Size.Bytes.
const (
	runHeaderBytes = 112 // run struct, rounded to its size class
	runPosBytes    = 16  // a run position: its sequence hash and segment reference
	segmentBytes   = 64  // segment struct, rounded
	chunkBytes     = 48  // one extra holder chunk
	entryBytes     = 32  // engine-hash map slot (16 bytes and a control byte) at its average load
	workerBytes    = 512
)

// Size returns the index's current size.
func (ix *Index) Size() Size {
	s := Size{
		Workers: ix.workers.Size(),
		Blocks:  int(ix.pub.blocks.Load()),
		Pairs:   int(ix.pub.pairs.Load()),
		Entries: int(ix.pub.entries.Load()),
	}
	s.Bytes = ix.pub.runBytes.Load() + ix.arena.bytes() + ix.blocks.bytes() + ix.pub.chunks.Load()*chunkBytes +
		int64(s.Entries)*entryBytes + int64(s.Workers)*workerBytes
	return s
}
