package scheduling

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
)

// testChain returns n chained hashes: a prompt of family fam that shares
// its first shared blocks with every prompt of the family and continues
// privately under tag. A block's hash names its whole prefix.
func testChain(fam uint64, shared, n int, tag uint64) []kvroute.SeqHash {
	out := make([]kvroute.SeqHash, n)
	for i := range out {
		if i < shared {
			out[i] = kvroute.SeqHash(fam<<32 | uint64(i) + 1)
		} else {
			out[i] = kvroute.SeqHash(tag<<56 | uint64(shared)<<40 | fam<<32 | uint64(i) + 1)
		}
	}
	return out
}

// TestChainSetMatchesModel checks the trie against a plain multiset of
// blocks under random adds and removes of branching chains, and that it
// stays compact: after every remove no segment could be merged with its
// only child.
func TestChainSetMatchesModel(t *testing.T) {
	for _, tc := range []struct {
		name           string
		fams, tags, mx int
	}{
		{"few families, short", 2, 3, 12},
		{"one family, long", 1, 8, 200},
		{"many families", 9, 2, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.mx), 3))
			var s chainSet
			type req struct {
				leaf   int32
				blocks []kvroute.SeqHash
			}
			var reqs []req
			counts := map[kvroute.SeqHash]int{}
			prompt := func() []kvroute.SeqHash {
				n := rng.IntN(tc.mx + 1)
				return testChain(uint64(rng.IntN(tc.fams)), rng.IntN(n+1), n, uint64(rng.IntN(tc.tags)+1))
			}
			for step := range 5000 {
				if len(reqs) == 0 || rng.IntN(5) < 3 {
					b := prompt()
					newBlocks := 0
					for _, h := range b {
						if counts[h] == 0 {
							newBlocks++
						}
						counts[h]++
					}
					leaf, added := s.add(b)
					require.Equal(t, newBlocks, added, "step %d", step)
					reqs = append(reqs, req{leaf, b})
				} else {
					i := rng.IntN(len(reqs))
					r := reqs[i]
					reqs[i] = reqs[len(reqs)-1]
					reqs = reqs[:len(reqs)-1]
					gone := 0
					for _, h := range r.blocks {
						if counts[h]--; counts[h] == 0 {
							delete(counts, h)
							gone++
						}
					}
					require.Equal(t, gone, s.remove(r.leaf), "step %d", step)
					for id := 1; id < len(s.segs); id++ {
						seg := &s.segs[id]
						if len(seg.hashes) > 0 && seg.nchild == 1 {
							require.NotEqual(t, seg.refs, s.segs[seg.child].refs, "step %d: segment %d not merged", step, id)
						}
					}
				}
				require.Equal(t, len(counts), s.len(), "step %d", step)
				q := prompt()
				want := 0
				for want < len(q) && counts[q[want]] > 0 {
					want++
				}
				require.Equal(t, want, s.prefix(q), "step %d", step)
			}
			for _, r := range reqs {
				s.remove(r.leaf)
			}
			require.Zero(t, s.len())
			require.Zero(t, s.table.len)
			require.Zero(t, s.segs[0].nchild)
		})
	}
}

// TestChainSetArbitraryHashes feeds hashes that are not chains (repeats,
// blocks shared out of position, zero): the counts may then differ from a
// multiset's, but nothing panics and removing everything empties the set.
func TestChainSetArbitraryHashes(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var s chainSet
	var leaves []int32
	for range 20_000 {
		if len(leaves) > 0 && rng.IntN(2) == 0 {
			i := rng.IntN(len(leaves))
			require.GreaterOrEqual(t, s.remove(leaves[i]), 0)
			leaves[i] = leaves[len(leaves)-1]
			leaves = leaves[:len(leaves)-1]
			continue
		}
		b := make([]kvroute.SeqHash, rng.IntN(10))
		for i := range b {
			b[i] = kvroute.SeqHash(rng.IntN(4))
		}
		_ = s.prefix(b)
		leaf, _ := s.add(b)
		leaves = append(leaves, leaf)
		require.GreaterOrEqual(t, s.len(), 0)
	}
	for _, l := range leaves {
		s.remove(l)
	}
	require.Zero(t, s.len())
	require.Zero(t, s.table.len)
}
