package main

import (
	"container/list"
	"fmt"
	"math/rand/v2"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/bench"
)

// eviction is how a worker's cache chooses blocks to drop when full.
type eviction int

const (
	// evictLRU drops the least recently used blocks. A request's blocks are
	// touched tail first, so a chain is dropped from its tail, as an engine
	// that frees a request's blocks in reverse order does.
	evictLRU eviction = iota
	// evictRandom drops blocks chosen uniformly at random, mid-chain ones
	// included: the worker then holds blocks after a hole, which no longer
	// count towards its overlap.
	evictRandom
)

// traceConfig shapes the trace replay.
type traceConfig struct {
	Workers     int
	Capacity    int // blocks per worker cache
	BlocksPerID int // 16-token blocks per 512-token Mooncake hash id
	Eviction    eviction
	Seed        uint64
	// Warm is the share of the records replayed first in an untimed
	// section (secWarm), so that the timed section (secSteady) measures a
	// router in its steady state: every worker's cache full and its maps
	// grown, each store making room with evictions. Zero replays every
	// record in one timed section (secReplay) from an empty index.
	Warm float64
}

// defaultTrace is the 8-worker replay with 8,192-block (131K-token) caches.
func defaultTrace(e eviction) traceConfig {
	return traceConfig{Workers: 8, Capacity: 8192, BlocksPerID: bench.MooncakeBlockTokens / kvroute.DefaultBlockSize, Eviction: e, Seed: 2}
}

// The trace workloads' sections: the whole replay from an empty index,
// or the warming part and the steady part after it.
const (
	secReplay = "replay"
	secWarm   = "warm"
	secSteady = "steady"
)

// warmShare is the share of the records that warms the index in the warm
// trace workloads: on the Mooncake sample with the default caches, every
// worker's cache is full before it.
const warmShare = 0.5

// traceBlocks returns the 16-token blocks of a trace record: hash id h at
// position i becomes BlocksPerID blocks whose local hashes are a pure
// function of (h, sub-block), so equal ids at equal positions give equal
// prefixes; the partial last 16-token block is dropped.
func traceBlocks(rec *bench.TraceRecord, perID int) []chainBlock {
	n := min(rec.InputLength/kvroute.DefaultBlockSize, len(rec.HashIDs)*perID)
	locals := make([]kvroute.BlockHash, n)
	for j := range locals {
		id := uint64(rec.HashIDs[j/perID])
		locals[j] = kvroute.BlockHash(mix(id*uint64(perID) + uint64(j%perID) + golden))
	}
	return chainBlocks(make([]chainBlock, 0, n), 0, false, locals)
}

// workerCache is one worker's eviction state beside the model.
type workerCache struct {
	lru  *list.List // of chainBlock, most recent at the front
	elem map[kvroute.SeqHash]*list.Element
	all  []chainBlock // random eviction: the held blocks
	pos  map[kvroute.SeqHash]int
}

// genTrace builds the trace replay: for each record, a query (the whole
// prompt), then the chosen worker's Removed event (when its cache must make
// room) and its Stored events for the blocks it lacks (an engine reports
// the blocks it newly caches: one event per run of missing blocks). The worker is chosen
// from the ground truth: the largest overlap, ties to the worker chosen
// least recently. Blocks of the current request are never evicted.
func genTrace(records []bench.TraceRecord, c traceConfig) (*workload, error) {
	rng := rand.New(rand.NewPCG(c.Seed, 0x7ace))
	m := newModel(c.Workers, 1<<16)
	caches := make([]workerCache, c.Workers)
	for i := range caches {
		caches[i] = workerCache{lru: list.New(), elem: map[kvroute.SeqHash]*list.Element{}, pos: map[kvroute.SeqHash]int{}}
	}
	lastChosen := make([]int, c.Workers)
	var ops []op
	split := -1 // ops before it warm the index
	for r := range records {
		if c.Warm > 0 && split < 0 && float64(r) >= c.Warm*float64(len(records)) {
			split = len(ops)
		}
		path := traceBlocks(&records[r], c.BlocksPerID)
		if len(path) == 0 {
			continue
		}
		if len(path) > c.Capacity {
			return nil, fmt.Errorf("peers: record %d has %d blocks, more than a cache of %d (raise -capacity)", r, len(path), c.Capacity)
		}
		q := m.query(path)
		ops = append(ops, q)

		w, best := 0, -1
		for i := range c.Workers {
			ov := 0
			for _, s := range q.Want {
				if s.Worker == workerID(i) {
					ov = int(s.Blocks)
				}
			}
			if ov > best || ov == best && lastChosen[i] < lastChosen[w] {
				w, best = i, ov
			}
		}
		lastChosen[w] = r + 1

		inReq := make(map[kvroute.SeqHash]struct{}, len(path))
		missing := 0
		for _, b := range path {
			inReq[b.Seq] = struct{}{}
			if !m.has(w, b.Seq) {
				missing++
			}
		}
		wc := &caches[w]
		if need := m.count[w] + missing - c.Capacity; need > 0 {
			victims := wc.evict(need, inReq, c.Eviction, rng)
			ops = append(ops, m.remove(w, victims))
		}
		// One Stored event per run of blocks the worker lacks, each with
		// the block before it as parent: with LRU eviction that is the
		// tail from the first missing block; after random evictions, the
		// holes too.
		for from := 0; from < len(path); {
			if m.has(w, path[from].Seq) {
				from++
				continue
			}
			to := from
			for to < len(path) && !m.has(w, path[to].Seq) {
				wc.add(path[to])
				to++
			}
			ops = append(ops, m.store(w, from, path[:to]))
			from = to
		}
		// Touch tail first so that the head is the most recently used.
		for i := len(path) - 1; i >= 0; i-- {
			if e, ok := wc.elem[path[i].Seq]; ok {
				wc.lru.MoveToFront(e)
			}
		}
	}
	w := &workload{BlockSize: kvroute.DefaultBlockSize}
	if split < 0 {
		w.Sections = []section{{Name: secReplay, Timed: true, Metric: perBlockOp, Repeat: 1, Ops: ops}}
	} else {
		w.Sections = []section{
			{Name: secWarm, Metric: perBlockOp, Repeat: 1, Ops: ops[:split]},
			{Name: secSteady, Timed: true, Metric: perBlockOp, Repeat: 1, Ops: ops[split:]},
		}
	}
	return w, nil
}

func (wc *workerCache) add(b chainBlock) {
	wc.elem[b.Seq] = wc.lru.PushFront(b)
	wc.pos[b.Seq] = len(wc.all)
	wc.all = append(wc.all, b)
}

func (wc *workerCache) drop(b chainBlock) {
	wc.lru.Remove(wc.elem[b.Seq])
	delete(wc.elem, b.Seq)
	i := wc.pos[b.Seq]
	last := wc.all[len(wc.all)-1]
	wc.all[i], wc.pos[last.Seq] = last, i
	wc.all = wc.all[:len(wc.all)-1]
	delete(wc.pos, b.Seq)
}

// evict chooses n blocks outside the current request and drops them from
// the cache state (the caller updates the model).
func (wc *workerCache) evict(n int, inReq map[kvroute.SeqHash]struct{}, e eviction, rng *rand.Rand) []chainBlock {
	victims := make([]chainBlock, 0, n)
	switch e {
	case evictLRU:
		for el := wc.lru.Back(); el != nil && len(victims) < n; {
			b, prev := el.Value.(chainBlock), el.Prev()
			if _, busy := inReq[b.Seq]; !busy {
				victims = append(victims, b)
			}
			el = prev
		}
	case evictRandom:
		for len(victims) < n {
			b := wc.all[rng.IntN(len(wc.all))]
			if _, busy := inReq[b.Seq]; busy {
				continue
			}
			victims = append(victims, b)
			wc.drop(b)
		}
		return victims
	}
	for _, b := range victims {
		wc.drop(b)
	}
	return victims
}
