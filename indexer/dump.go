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
// Dump locks one worker at a time; events applied to other workers while it
// runs may or may not be included.
func (ix *Index) Dump(fn func(*kvroute.Event) error) error {
	for _, w := range ix.Workers() {
		ws := ix.lockLive(w, false)
		if ws == nil {
			continue
		}
		err := ix.dumpWorker(ws, fn)
		ws.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

type dumpEntry struct {
	ext kvroute.ExternalHash
	e   entry
}

func (ix *Index) dumpWorker(ws *workerState, fn func(*kvroute.Event) error) error {
	entries := make([]dumpEntry, 0, ws.blocks.len())
	held := make(map[kvroute.SeqHash]kvroute.ExternalHash, ws.blocks.len())
	ws.blocks.all(func(ext kvroute.ExternalHash, e entry) {
		entries = append(entries, dumpEntry{ext, e})
		if prev, ok := held[e.n.seq]; !ok || ext < prev {
			held[e.n.seq] = ext
		}
	})
	slices.SortFunc(entries, func(a, b dumpEntry) int {
		if c := cmp.Compare(a.e.n.depth, b.e.n.depth); c != 0 {
			return c
		}
		return cmp.Compare(a.ext, b.ext)
	})

	ev := kvroute.Event{Kind: kvroute.EventStored, Worker: ws.key}
	blocks := make([]kvroute.StoredBlock, 1)
	emit := func(parent *node, parentExt kvroute.ExternalHash, ext kvroute.ExternalHash, n *node, t kvroute.Tier) error {
		blocks[0] = kvroute.StoredBlock{External: ext, Hash: n.local}
		ev = kvroute.Event{Kind: kvroute.EventStored, Worker: ws.key, Tier: t, Blocks: blocks,
			HasParent: parent != nil, Parent: parentExt}
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
	// parentHash returns the engine hash to name n's parent by, emitting
	// placeholder ancestors first when the worker does not hold them.
	var parentHash func(n *node) (kvroute.ExternalHash, error)
	parentHash = func(n *node) (kvroute.ExternalHash, error) {
		p := n.parent
		if ext, ok := held[p.seq]; ok {
			return ext, nil
		}
		if ext, ok := placeholders[p.seq]; ok {
			return ext, nil
		}
		var pext kvroute.ExternalHash
		if p.parent != nil {
			var err error
			if pext, err = parentHash(p); err != nil {
				return 0, err
			}
		}
		ext := freeHash()
		placeholders[p.seq] = ext
		order = append(order, ext)
		var pp *node
		if p.parent != nil {
			pp = p.parent
		}
		return ext, emit(pp, pext, ext, p, kvroute.TierDevice)
	}

	for _, de := range entries {
		n := de.e.n
		var pext kvroute.ExternalHash
		if n.parent != nil {
			var err error
			if pext, err = parentHash(n); err != nil {
				return err
			}
		}
		for t := kvroute.Tier(0); t < kvroute.NumTiers; t++ {
			if de.e.tiers&(1<<t) == 0 {
				continue
			}
			if err := emit(n.parent, pext, de.ext, n, t); err != nil {
				return err
			}
		}
	}
	if len(order) > 0 {
		ev = kvroute.Event{Kind: kvroute.EventRemoved, Worker: ws.key, Tier: kvroute.TierDevice, Removed: order}
		return fn(&ev)
	}
	return nil
}
