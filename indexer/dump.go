package indexer

import (
	"cmp"
	"slices"

	"github.com/kvroute/kvroute"
)

// Dump calls fn with a stream of unsequenced events that rebuilds the index:
// applying them, in order, to an empty Index gives an index that matches
// every prompt the same way and holds the same blocks under the same
// engine hashes. The index keeps no block's content hash, so its Stored
// events carry sequence hashes (kvroute.Event.SeqHashes), which any Index
// takes as they are, whatever its Hasher. It stops at the first error fn returns and
// returns it. The event passed to fn is reused: fn must not retain it.
//
// Blocks are emitted worker by worker, parents before children, one Stored
// event per (block, tier). A block whose worker no longer holds its parent
// (the engine evicted the parent first) is emitted under placeholder
// ancestors that are removed again right after, so that it is restored
// exactly as unreachable-until-its-parent-returns. A worker the index
// knows that holds no block is emitted as one Cleared event, so that the
// rebuilt index knows it too (Workers lists the same keys).
//
// Dump takes a snapshot of one worker at a time under the index's write
// lock and calls fn after releasing it, so a slow fn never holds up
// ingest; events applied meanwhile may or may not be included. The
// snapshot costs about 40 bytes per block of the worker being dumped.
func (ix *Index) Dump(fn func(*kvroute.Event) error) error {
	for _, w := range ix.Workers() {
		if err := ix.dumpWorker(w, fn); err != nil {
			return err
		}
	}
	return nil
}

// DumpWorker is Dump for worker w alone: the events that rebuild its
// blocks, in an index that has none of them (or a Cleared event when it is
// known and holds none; nothing when it is not known). It costs the
// worker's blocks, not the whole index's.
func (ix *Index) DumpWorker(w kvroute.WorkerKey, fn func(*kvroute.Event) error) error {
	return ix.dumpWorker(w, fn)
}

// dumpBlock is one block a worker holds, as Dump emits it.
type dumpBlock struct {
	ext   kvroute.ExternalHash
	r     *run
	pos   int
	tiers uint8
}

func (ix *Index) dumpWorker(w kvroute.WorkerKey, fn func(*kvroute.Event) error) error {
	stored, placeholders, known := ix.snapshotWorker(w)
	var ev kvroute.Event
	if known && len(stored) == 0 && len(placeholders) == 0 {
		ev = kvroute.Event{Kind: kvroute.EventCleared, Worker: w}
		return fn(&ev)
	}
	blk := make([]kvroute.StoredBlock, 1)
	for _, s := range stored {
		blk[0] = kvroute.StoredBlock{External: s.ext, Hash: kvroute.BlockHash(s.seq)}
		ev = kvroute.Event{Kind: kvroute.EventStored, Worker: w, Tier: s.tier, Blocks: blk,
			HasParent: s.hasParent, Parent: s.parent, SeqHashes: true}
		if err := fn(&ev); err != nil {
			return err
		}
	}
	if len(placeholders) > 0 {
		ev = kvroute.Event{Kind: kvroute.EventRemoved, Worker: w, Tier: kvroute.TierDevice, Removed: placeholders}
		return fn(&ev)
	}
	return nil
}

// snapshotWorker returns, under the write lock, the Stored events that
// rebuild worker w's blocks in order and the placeholder engine hashes to
// remove after them (deepest first), and whether the index knows w.
func (ix *Index) snapshotWorker(w kvroute.WorkerKey) ([]dumpStored, []kvroute.ExternalHash, bool) {
	ix.mu.Lock()
	defer ix.unlock()
	ws := ix.worker(w, false)
	if ws == nil {
		return nil, nil, false
	}
	blocks := make([]dumpBlock, 0, ws.blocks.len())
	ws.blocks.all(func(ext kvroute.ExternalHash, e entry) {
		r, pos := ix.place(e)
		blocks = append(blocks, dumpBlock{ext: ext, r: r, pos: pos, tiers: e.tiers})
	})
	slices.SortFunc(blocks, func(a, b dumpBlock) int { return cmp.Compare(a.ext, b.ext) })
	held := make(map[kvroute.SeqHash]int, len(blocks)) // seq → index of its smallest engine hash
	for i, b := range blocks {
		if s := b.r.seqs[b.pos]; !hasKey(held, s) {
			held[s] = i
		}
	}

	// The events are recorded under the lock and passed to fn after it.
	var out []dumpStored
	emit := func(ext kvroute.ExternalHash, seq kvroute.SeqHash, parentExt kvroute.ExternalHash, hasParent bool, t kvroute.Tier) {
		out = append(out, dumpStored{ext: ext, seq: seq, parent: parentExt, hasParent: hasParent, tier: t})
	}

	// placeholders are engine hashes invented for ancestors the worker does
	// not hold; they are removed once the worker's blocks are out.
	placeholders := map[kvroute.SeqHash]kvroute.ExternalHash{}
	var order []kvroute.ExternalHash
	nextFree := kvroute.ExternalHash(0x6b76726f75746500) // "kvroute\x00"
	freeHash := func() kvroute.ExternalHash {
		for {
			nextFree++
			if _, used := ws.blocks.get(nextFree); !used {
				return nextFree
			}
		}
	}
	done := make([]bool, len(blocks))
	// name returns the engine hash to name the block at (r, pos) by as a
	// parent, emitting it first (or a placeholder for it and its missing
	// ancestors) when it is not out yet.
	var name func(r *run, pos int) kvroute.ExternalHash
	emitHeld := func(i int) {
		done[i] = true
		b := &blocks[i]
		pr, pp, hasParent := b.r.parentPlace(b.pos)
		var pext kvroute.ExternalHash
		if hasParent {
			pext = name(pr, pp)
		}
		for t := kvroute.Tier(0); t < kvroute.NumTiers; t++ {
			if b.tiers&(1<<t) != 0 {
				emit(b.ext, b.r.seqs[b.pos], pext, hasParent, t)
			}
		}
	}
	name = func(r *run, pos int) kvroute.ExternalHash {
		seq := r.seqs[pos]
		if i, ok := held[seq]; ok {
			if !done[i] {
				emitHeld(i)
			}
			return blocks[i].ext
		}
		if ext, ok := placeholders[seq]; ok {
			return ext
		}
		pr, pp, hasParent := r.parentPlace(pos)
		var pext kvroute.ExternalHash
		if hasParent {
			pext = name(pr, pp)
		}
		ext := freeHash()
		placeholders[seq] = ext
		order = append(order, ext)
		emit(ext, seq, pext, hasParent, kvroute.TierDevice)
		return ext
	}
	for i := range blocks {
		if !done[i] {
			emitHeld(i)
		}
	}
	// Remove the deepest placeholders first, as an engine evicts.
	slices.Reverse(order)
	return out, order, true
}

// dumpStored is one Stored event of a worker's snapshot.
type dumpStored struct {
	ext, parent kvroute.ExternalHash
	seq         kvroute.SeqHash
	hasParent   bool
	tier        kvroute.Tier
}
