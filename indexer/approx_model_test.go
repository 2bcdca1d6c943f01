package indexer_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/internal/clocktest"
)

// TestApproxRandomizedAgainstModel inserts random prompts (over a small
// alphabet, so that workers share prefixes) for a few workers as time
// passes, expires, resets and removes workers, and compares the
// approximate index with a plain model: a (worker, block) pair is held
// exactly while its last insert is younger than the TTL. With a bound on
// the pairs, which ones pruning keeps depends on ties, so there the pairs
// held, the bound and the holder bits' agreement with the counters are
// checked instead.
func TestApproxRandomizedAgainstModel(t *testing.T) {
	probeSet := probes()
	for trial := range 40 {
		bounded := trial%2 == 1
		if err := runApproxHistory(uint64(trial), bounded, probeSet); err != nil {
			t.Fatalf("trial %d (bounded %v): %v", trial, bounded, err)
		}
	}
}

func runApproxHistory(seed uint64, bounded bool, probeSet [][]kvroute.SeqHash) error {
	const ttl = 10 * time.Second
	r := rand.New(rand.NewPCG(seed, 45))
	clock := clocktest.New(time.Unix(1000, 0))
	cfg := indexer.ApproxConfig{TTL: ttl, Clock: clock, Index: indexer.Config{Hasher: testHasher}, MaxBlocks: 1 << 20}
	if bounded {
		cfg.MaxBlocks = 5 + r.IntN(20)
	}
	a, err := indexer.NewApprox(cfg)
	if err != nil {
		return err
	}
	type pair struct {
		w   kvroute.WorkerKey
		seq kvroute.SeqHash
	}
	stamps := map[pair]time.Time{} // the model, unbounded
	expire := func() {
		for p, at := range stamps {
			if !at.After(clock.Now().Add(-ttl)) {
				delete(stamps, p)
			}
		}
	}
	workers := []kvroute.WorkerKey{wk(1), wk(2), {ID: 2, Rank: 1}, wk(70)}
	for op := range 300 {
		w := workers[r.IntN(len(workers))]
		switch p := r.IntN(100); {
		case p < 60:
			var bases []uint32
			for range 1 + r.IntN(probeDepth) {
				bases = append(bases, uint32(r.IntN(probeAlphabet)))
			}
			_, seqs := testHasher.AppendHashes(nil, nil, prompt(bases...))
			a.Insert(w, seqs)
			for _, s := range seqs {
				stamps[pair{w, s}] = clock.Now()
			}
			expire()
		case p < 85:
			clock.Advance(time.Duration(r.IntN(4000)) * time.Millisecond)
			if r.IntN(2) == 0 {
				a.Expire()
				expire()
			}
		case p < 90:
			a.Expire()
			expire()
		case p < 95:
			a.ResetWorker(w)
			for p := range stamps {
				if p.w == w {
					delete(stamps, p)
				}
			}
		default:
			a.RemoveWorker(w)
			for p := range stamps {
				if p.w == w {
					delete(stamps, p)
				}
			}
		}
		held, pairs, err := indexer.HeldBlocks(a.Index)
		if err != nil {
			return fmt.Errorf("op %d: %w", op, err)
		}
		if err := indexer.Recount(a.Index); err != nil {
			return fmt.Errorf("op %d: %w", op, err)
		}
		if n := a.Len(); n != pairs || a.Size().Pairs != pairs || a.Size().Entries != pairs {
			return fmt.Errorf("op %d: Len %d, Size %+v, holder bits make %d pairs", op, n, a.Size(), pairs)
		}
		if bounded {
			if pairs > cfg.MaxBlocks {
				return fmt.Errorf("op %d: %d pairs over the bound %d", op, pairs, cfg.MaxBlocks)
			}
			// Every pair held is one the model has: pruning only drops.
			for w, seqs := range held {
				for s := range seqs {
					if _, ok := stamps[pair{w, s}]; !ok {
						return fmt.Errorf("op %d: worker %v holds %#x, expired or never inserted", op, w, uint64(s))
					}
				}
			}
			continue
		}
		if pairs != len(stamps) {
			return fmt.Errorf("op %d: %d pairs held, model %d", op, pairs, len(stamps))
		}
		for p := range stamps {
			if held[p.w][p.seq] != 1<<kvroute.TierDevice {
				return fmt.Errorf("op %d: worker %v does not hold %#x on the device", op, p.w, uint64(p.seq))
			}
		}
	}
	if bounded {
		return nil
	}
	tiers := map[kvroute.WorkerKey]map[kvroute.SeqHash]uint8{}
	for p := range stamps {
		if tiers[p.w] == nil {
			tiers[p.w] = map[kvroute.SeqHash]uint8{}
		}
		tiers[p.w][p.seq] = 1
	}
	var res indexer.MatchResult
	for _, p := range probeSet {
		a.Match(p, &res)
		for _, w := range workers {
			byTier, depth := matchTiers(tiers[w], p)
			got, ok := res.Find(w)
			if ok != (depth > 0) || got.Blocks != depth || (ok && got.ByTier != byTier) {
				return fmt.Errorf("worker %v on a %d-block prompt: index %+v (found %v), model %d blocks %v", w, len(p), got, ok, depth, byTier)
			}
		}
	}
	return nil
}
