package main

import (
	"fmt"
	"math/bits"
	"slices"

	"github.com/kvroute/kvroute"
)

// maxWorkers is the largest cluster the model tracks (one bit per worker).
const maxWorkers = 64

// chainBlock is one block of a prefix: its local (token) hash, its chained
// sequence hash and the engine's hash for it.
type chainBlock struct {
	Local kvroute.BlockHash
	Seq   kvroute.SeqHash
	Ext   kvroute.ExternalHash
}

// extSalt separates engine hashes from sequence hashes.
const extSalt = 0x6a09e667f3bcc909

// chainBlocks returns the blocks of a prefix whose local hashes are locals,
// chained onto parent (a sequence hash) when hasParent is set. The engine
// hash of a block is a pure function of its sequence hash, as it is for an
// engine that hashes prefixes deterministically, so every worker names a
// block alike.
func chainBlocks(dst []chainBlock, parent kvroute.SeqHash, hasParent bool, locals []kvroute.BlockHash) []chainBlock {
	for _, l := range locals {
		if hasParent {
			parent = kvroute.NextSeqHash(parent, l)
		} else {
			parent, hasParent = kvroute.SeqHash(l), true
		}
		dst = append(dst, chainBlock{Local: l, Seq: parent, Ext: extOf(parent)})
	}
	return dst
}

// extOf is the engine hash of the block with sequence hash s.
func extOf(s kvroute.SeqHash) kvroute.ExternalHash {
	return kvroute.ExternalHash(mix(uint64(s) ^ extSalt))
}

// model is the ground truth: the set of blocks each worker holds, as a
// holder bitmask per sequence hash (bit i is the worker with id i+1). A
// worker's overlap with a query is the number of leading query blocks it
// holds, contiguous from the first; nothing else (no tree, no parent links)
// is involved, so mid-chain removals are exact by construction.
//
// The model also numbers each worker's events from 1, as an engine does.
type model struct {
	workers int
	held    map[kvroute.SeqHash]uint64
	count   []int    // blocks held per worker
	nextID  []uint64 // next event id per worker
}

func newModel(workers, sizeHint int) *model {
	if workers < 1 || workers > maxWorkers {
		panic(fmt.Sprintf("peers: %d workers (1 to %d)", workers, maxWorkers))
	}
	m := &model{
		workers: workers,
		held:    make(map[kvroute.SeqHash]uint64, sizeHint),
		count:   make([]int, workers),
		nextID:  make([]uint64, workers),
	}
	for i := range m.nextID {
		m.nextID[i] = 1
	}
	return m
}

// workerID is the id of the worker with index w.
func workerID(w int) uint64 { return uint64(w) + 1 }

// has reports whether worker w holds the block.
func (m *model) has(w int, s kvroute.SeqHash) bool { return m.held[s]&(1<<w) != 0 }

// leading returns how many leading blocks of path worker w holds.
func (m *model) leading(w int, path []chainBlock) int {
	for i, b := range path {
		if !m.has(w, b.Seq) {
			return i
		}
	}
	return len(path)
}

// overlaps returns every worker's overlap with path, sorted by worker,
// omitting workers with none.
func (m *model) overlaps(path []chainBlock) []score {
	alive := uint64(1)<<m.workers - 1
	if m.workers == maxWorkers {
		alive = ^uint64(0)
	}
	var out []score
	for i, b := range path {
		h := m.held[b.Seq]
		if lost := alive &^ h; i > 0 {
			for ; lost != 0; lost &= lost - 1 {
				out = append(out, score{Worker: workerID(bits.TrailingZeros64(lost)), Blocks: uint32(i)})
			}
		}
		if alive &= h; alive == 0 {
			break
		}
	}
	for ; alive != 0; alive &= alive - 1 {
		out = append(out, score{Worker: workerID(bits.TrailingZeros64(alive)), Blocks: uint32(len(path))})
	}
	slices.SortFunc(out, func(a, b score) int { return int(a.Worker) - int(b.Worker) })
	return out
}

// query returns a Query operation for path with its expected overlaps.
func (m *model) query(path []chainBlock) op {
	o := op{
		Kind:   opQuery,
		Locals: make([]kvroute.BlockHash, len(path)),
		Seqs:   make([]kvroute.SeqHash, len(path)),
		Want:   m.overlaps(path),
	}
	for i, b := range path {
		o.Locals[i], o.Seqs[i] = b.Local, b.Seq
	}
	return o
}

// store records that worker w stores path[from:], whose parent is
// path[from-1] (none when from is 0), and returns the Stored event. Blocks
// the worker already holds are stored again, as an engine that recomputes
// them reports them.
func (m *model) store(w, from int, path []chainBlock) op {
	o := op{Kind: opStored, Worker: workerID(w), EventID: m.nextID[w]}
	m.nextID[w]++
	if from > 0 {
		o.HasParent, o.Parent = true, path[from-1].Ext
	}
	o.Blocks = make([]block, 0, len(path)-from)
	for _, b := range path[from:] {
		o.Blocks = append(o.Blocks, block{Local: b.Local, Ext: b.Ext})
		if h := m.held[b.Seq]; h&(1<<w) == 0 {
			m.held[b.Seq] = h | 1<<w
			m.count[w]++
		}
	}
	return o
}

// remove records that worker w dropped blocks (which it holds) and returns
// the Removed event listing them in the given order.
func (m *model) remove(w int, blocks []chainBlock) op {
	o := op{Kind: opRemoved, Worker: workerID(w), EventID: m.nextID[w]}
	m.nextID[w]++
	o.Removed = make([]kvroute.ExternalHash, len(blocks))
	for i, b := range blocks {
		o.Removed[i] = b.Ext
		h := m.held[b.Seq]
		if h&(1<<w) == 0 {
			panic("peers: model removes a block the worker does not hold")
		}
		if h &^= 1 << w; h == 0 {
			delete(m.held, b.Seq)
		} else {
			m.held[b.Seq] = h
		}
		m.count[w]--
	}
	return o
}
