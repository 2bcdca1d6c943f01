package main

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute"
)

// treeConfig shapes the large-index workload: a forest of prefixes with
// Chains × ChainLen distinct blocks spread over Workers workers, queried in
// three ways, then grown by ApplyChains × ChainLen new blocks.
type treeConfig struct {
	Workers  int
	Chains   int     // chains of new blocks in the index the queries run on
	ChainLen int     // new blocks per chain
	Branch   float64 // probability that a chain continues an earlier prefix
	MaxDepth int     // longest prefix a chain may continue from
	// SameWorker is the probability that a continuing chain is stored by
	// the worker that stored the prefix (a router keeps a conversation on
	// its worker); otherwise a random worker stores the whole path.
	SameWorker float64
	Share      float64 // probability that other workers also store a prefix of a chain
	MaxShare   int     // at most this many other workers per shared chain

	QueryLen       int
	HotQueries     int // distinct hot queries
	HotRepeat      int // passes over them
	ColdQueries    int
	ColdRepeat     int
	PartialQueries int
	PartialRepeat  int

	ApplyChains  int // chains of new blocks in the timed apply section
	CheckQueries int // untimed queries after the apply section

	Seed uint64
}

// defaultTree is the 1M-block, 64-worker shape.
func defaultTree() treeConfig {
	return treeConfig{
		Workers: 64, Chains: 15625, ChainLen: 64, Branch: 0.5, MaxDepth: 192, SameWorker: 0.75,
		Share: 0.3, MaxShare: 3,
		QueryLen: 64, HotQueries: 32, HotRepeat: 1000,
		ColdQueries: 20000, ColdRepeat: 3, PartialQueries: 20000, PartialRepeat: 3,
		ApplyChains: 15625, CheckQueries: 2000,
		Seed: 1,
	}
}

// scaled returns c with every count multiplied by f (at least 1).
func (c treeConfig) scaled(f float64) treeConfig {
	s := func(n int) int { return max(1, int(float64(n)*f)) }
	c.Chains, c.ApplyChains, c.CheckQueries = s(c.Chains), s(c.ApplyChains), s(c.CheckQueries)
	c.HotRepeat, c.ColdQueries, c.PartialQueries = s(c.HotRepeat), s(c.ColdQueries), s(c.PartialQueries)
	return c
}

// Section names of the tree workload.
const (
	secBuild   = "build"
	secHot     = "hot"
	secCold    = "cold"
	secPartial = "partial"
	secApply   = "apply"
	secCheck   = "apply-check"
)

// genTree builds the tree workload.
//
// Build (untimed): chain c gets ChainLen new blocks. With probability
// Branch it continues a random earlier chain's prefix at a random depth
// (at most MaxDepth), otherwise it starts at the root. A worker (the one
// that stored the prefix with probability SameWorker, else a random one)
// stores the chain's whole path, from the first block it does not already
// hold (so its event has that block's predecessor as parent), and with
// probability Share up to MaxShare other workers store a random-length
// prefix of the same path: several workers then hold a prefix at
// different depths.
//
// Queries (timed) take the first QueryLen blocks of a chain's path: "hot"
// repeats a few of them, "cold" draws chains uniformly, "partial" replaces
// the blocks after a random position with blocks nobody stores.
//
// Apply (timed, per block): ApplyChains chains of ChainLen new blocks, each
// either from the root by a random worker or continuing a random block of
// the built index, stored by a worker that holds that block. A few untimed
// queries over the new paths follow.
func genTree(c treeConfig) *workload {
	rng := rand.New(rand.NewPCG(c.Seed, 0x7ee))
	m := newModel(c.Workers, (c.Chains+c.ApplyChains)*c.ChainLen)
	locals := make([]kvroute.BlockHash, c.ChainLen)
	newLocals := func() []kvroute.BlockHash {
		for i := range locals {
			locals[i] = kvroute.BlockHash(rng.Uint64())
		}
		return locals
	}

	// paths[c] is the whole path of chain c from the root; owner[c] stores it.
	paths := make([][]chainBlock, 0, c.Chains)
	owner := make([]int, 0, c.Chains)
	var build []op
	for range c.Chains {
		var prefix []chainBlock
		w := rng.IntN(c.Workers)
		if len(paths) > 0 && rng.Float64() < c.Branch {
			i := rng.IntN(len(paths))
			prefix = paths[i][:1+rng.IntN(min(len(paths[i]), c.MaxDepth))]
			if rng.Float64() < c.SameWorker {
				w = owner[i]
			}
		}
		path := make([]chainBlock, len(prefix), len(prefix)+c.ChainLen)
		copy(path, prefix)
		if len(prefix) > 0 {
			path = chainBlocks(path, prefix[len(prefix)-1].Seq, true, newLocals())
		} else {
			path = chainBlocks(path, 0, false, newLocals())
		}
		build = append(build, m.store(w, m.leading(w, path), path))
		paths, owner = append(paths, path), append(owner, w)
		if rng.Float64() < c.Share {
			for range 1 + rng.IntN(c.MaxShare) {
				o := rng.IntN(c.Workers)
				n := 1 + rng.IntN(len(path))
				if h := m.leading(o, path[:n]); h < n {
					build = append(build, m.store(o, h, path[:n]))
				}
			}
		}
	}

	queryOf := func(path []chainBlock) op { return m.query(path[:min(len(path), c.QueryLen)]) }
	hot := make([]op, c.HotQueries)
	for i := range hot {
		hot[i] = queryOf(paths[rng.IntN(len(paths))])
	}
	cold := make([]op, c.ColdQueries)
	for i := range cold {
		cold[i] = queryOf(paths[rng.IntN(len(paths))])
	}
	partial := make([]op, c.PartialQueries)
	for i := range partial {
		p := paths[rng.IntN(len(paths))]
		p = p[:min(len(p), c.QueryLen)]
		j := 1 + rng.IntN(len(p)-1)
		q := make([]chainBlock, j, len(p))
		copy(q, p[:j])
		q = chainBlocks(q, q[j-1].Seq, true, newLocals()[:len(p)-j])
		partial[i] = m.query(q)
	}

	apply := make([]op, 0, c.ApplyChains)
	applied := make([][]chainBlock, 0, c.ApplyChains)
	for range c.ApplyChains {
		var path []chainBlock
		var w int
		if rng.IntN(2) == 0 {
			w = rng.IntN(c.Workers)
			path = chainBlocks(make([]chainBlock, 0, c.ChainLen), 0, false, newLocals())
		} else {
			i := rng.IntN(len(paths))
			p := paths[i]
			p = p[:1+rng.IntN(len(p))]
			w = owner[i]
			path = make([]chainBlock, len(p), len(p)+c.ChainLen)
			copy(path, p)
			path = chainBlocks(path, p[len(p)-1].Seq, true, newLocals())
		}
		from := len(path) - c.ChainLen
		if m.leading(w, path[:from]) != from {
			panic("peers: apply chain continues a prefix its worker does not hold")
		}
		apply = append(apply, m.store(w, from, path))
		applied = append(applied, path)
	}
	check := make([]op, c.CheckQueries)
	for i := range check {
		check[i] = m.query(applied[rng.IntN(len(applied))])
	}

	return &workload{
		BlockSize: kvroute.DefaultBlockSize,
		Sections: []section{
			{Name: secBuild, Metric: perBlockOp, Repeat: 1, Ops: build},
			{Name: secHot, Timed: true, Metric: perOp, Repeat: c.HotRepeat, Ops: hot},
			{Name: secCold, Timed: true, Metric: perOp, Repeat: c.ColdRepeat, Ops: cold},
			{Name: secPartial, Timed: true, Metric: perOp, Repeat: c.PartialRepeat, Ops: partial},
			{Name: secApply, Timed: true, Metric: perBlockOp, Repeat: 1, Ops: apply},
			{Name: secCheck, Metric: perOp, Repeat: 1, Ops: check},
		},
	}
}
