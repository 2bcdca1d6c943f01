package indexer

import (
	"cmp"
	"slices"

	"github.com/kvroute/kvroute"
)

// Dump calls fn with a stream of unsequenced events that rebuilds the index:
// applying them, in order, to an empty Index with the same Hasher gives an
// index that matches every prompt the same way and holds the same blocks
// under the same engine hashes. It stops at the first error fn returns and
// returns it. The event passed to fn is reused: fn must not retain it.
//
// Blocks are emitted worker by worker, parents before children, one Stored
// event per (block, tier). A block whose worker no longer holds its parent
// (the engine evicted the parent first) is emitted under placeholder
// ancestors that are removed again right after, so that it is restored
// exactly as unreachable-until-its-parent-returns.
//
// Dump holds the index's write lock while it emits one worker's blocks;
// events applied to other workers meanwhile may or may not be included.
func (ix *Index) Dump(fn func(*kvroute.Event) error) error {
	for _, w := range ix.Workers() {
		if err := ix.dumpWorker(w, fn); err != nil {
			return err
		}
	}
	return nil
}

// dumpBlock is one block a worker holds, as Dump emits it.
type dumpBlock struct {
	ext   kvroute.ExternalHash
	r     *run
	pos   int
	tiers uint8
}

func (ix *Index) dumpWorker(w kvroute.WorkerKey, fn func(*kvroute.Event) error) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ws := ix.worker(w, false)
	if ws == nil {
		return nil
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

	blk := make([]kvroute.StoredBlock, 1)
	var ev kvroute.Event
	emit := func(ext kvroute.ExternalHash, local kvroute.BlockHash, parentExt kvroute.ExternalHash, hasParent bool, t kvroute.Tier) error {
		blk[0] = kvroute.StoredBlock{External: ext, Hash: local}
		ev = kvroute.Event{Kind: kvroute.EventStored, Worker: w, Tier: t, Blocks: blk,
			HasParent: hasParent, Parent: parentExt}
		return fn(&ev)
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
	var name func(r *run, pos int) (kvroute.ExternalHash, error)
	emitHeld := func(i int) error {
		done[i] = true
		b := &blocks[i]
		pr, pp, hasParent := b.r.parentPlace(b.pos)
		var pext kvroute.ExternalHash
		if hasParent {
			var err error
			if pext, err = name(pr, pp); err != nil {
				return err
			}
		}
		for t := kvroute.Tier(0); t < kvroute.NumTiers; t++ {
			if b.tiers&(1<<t) != 0 {
				if err := emit(b.ext, b.r.locals[b.pos], pext, hasParent, t); err != nil {
					return err
				}
			}
		}
		return nil
	}
	name = func(r *run, pos int) (kvroute.ExternalHash, error) {
		seq := r.seqs[pos]
		if i, ok := held[seq]; ok {
			if !done[i] {
				if err := emitHeld(i); err != nil {
					return 0, err
				}
			}
			return blocks[i].ext, nil
		}
		if ext, ok := placeholders[seq]; ok {
			return ext, nil
		}
		pr, pp, hasParent := r.parentPlace(pos)
		var pext kvroute.ExternalHash
		if hasParent {
			var err error
			if pext, err = name(pr, pp); err != nil {
				return 0, err
			}
		}
		ext := freeHash()
		placeholders[seq] = ext
		order = append(order, ext)
		return ext, emit(ext, r.locals[pos], pext, hasParent, kvroute.TierDevice)
	}
	for i := range blocks {
		if !done[i] {
			if err := emitHeld(i); err != nil {
				return err
			}
		}
	}
	if len(order) > 0 {
		// Remove the deepest placeholders first, as an engine evicts.
		slices.Reverse(order)
		ev = kvroute.Event{Kind: kvroute.EventRemoved, Worker: w, Tier: kvroute.TierDevice, Removed: order}
		return fn(&ev)
	}
	return nil
}
