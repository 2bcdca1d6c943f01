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
// (the engine evicted the parent first) is emitted under a placeholder root
// block that stands for the parent's whole prefix (its hash is the
// parent's sequence hash) and is removed again right after, so that the
// block is restored exactly as unreachable-until-its-parent-returns.
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
	ext       kvroute.ExternalHash
	seq       kvroute.SeqHash
	local     kvroute.BlockHash
	parent    kvroute.SeqHash
	hasParent bool
	tiers     uint8
}

func (ix *Index) dumpWorker(w kvroute.WorkerKey, fn func(*kvroute.Event) error) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ws := ix.worker(w, false)
	if ws == nil {
		return nil
	}
	blocks := make([]dumpBlock, 0, ws.blocks.len())
	held := make(map[kvroute.SeqHash]int, ws.blocks.len()) // seq → index of its smallest engine hash
	ws.blocks.all(func(ext kvroute.ExternalHash, e entry) {
		n, off, ok := ix.blocks.get(e.seq)
		if !ok {
			return
		}
		b := dumpBlock{ext: ext, seq: e.seq, local: n.locals[off], tiers: e.tiers}
		b.parent, b.hasParent = n.parentOf(off)
		blocks = append(blocks, b)
	})
	slices.SortFunc(blocks, func(a, b dumpBlock) int { return cmp.Compare(a.ext, b.ext) })
	for i, b := range blocks {
		if _, ok := held[b.seq]; !ok {
			held[b.seq] = i
		}
	}

	blk := make([]kvroute.StoredBlock, 1)
	var ev kvroute.Event
	emit := func(b *dumpBlock, parentExt kvroute.ExternalHash, hasParent bool, t kvroute.Tier) error {
		blk[0] = kvroute.StoredBlock{External: b.ext, Hash: b.local}
		ev = kvroute.Event{Kind: kvroute.EventStored, Worker: w, Tier: t, Blocks: blk,
			HasParent: hasParent, Parent: parentExt}
		return fn(&ev)
	}

	// placeholders are engine hashes invented for parents the worker does
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
	var stack []int
	for i := range blocks {
		// Emit the held ancestors of block i first, root-most first.
		stack = append(stack[:0], i)
		for j := i; blocks[j].hasParent; {
			p, ok := held[blocks[j].parent]
			if !ok || done[p] {
				break
			}
			stack = append(stack, p)
			j = p
		}
		for k := len(stack) - 1; k >= 0; k-- {
			j := stack[k]
			if done[j] {
				continue
			}
			done[j] = true
			b := &blocks[j]
			var pext kvroute.ExternalHash
			if b.hasParent {
				if p, ok := held[b.parent]; ok {
					pext = blocks[p].ext
				} else if ph, ok := placeholders[b.parent]; ok {
					pext = ph
				} else {
					pext = freeHash()
					placeholders[b.parent] = pext
					order = append(order, pext)
					stand := dumpBlock{ext: pext, local: kvroute.BlockHash(b.parent)}
					if err := emit(&stand, 0, false, kvroute.TierDevice); err != nil {
						return err
					}
				}
			}
			for t := kvroute.Tier(0); t < kvroute.NumTiers; t++ {
				if b.tiers&(1<<t) == 0 {
					continue
				}
				if err := emit(b, pext, b.hasParent, t); err != nil {
					return err
				}
			}
		}
	}
	if len(order) > 0 {
		ev = kvroute.Event{Kind: kvroute.EventRemoved, Worker: w, Tier: kvroute.TierDevice, Removed: order}
		return fn(&ev)
	}
	return nil
}
