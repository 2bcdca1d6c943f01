package scheduling

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
)

func TestBlockCountsMatchesMap(t *testing.T) {
	for _, keySpace := range []uint64{4, 100, 5000} {
		rng := rand.New(rand.NewPCG(keySpace, 1))
		var s blockCounts
		model := map[kvroute.SeqHash]int32{}
		for step := range 40_000 {
			h := kvroute.SeqHash(rng.Uint64N(keySpace))
			if keySpace > 4 {
				h *= 0x1000_0000_0001 // spread, but keep 0 in play
			}
			if rng.IntN(5) < 3 {
				require.Equal(t, model[h] == 0, s.inc(h), "step %d", step)
				model[h]++
			} else {
				gone := model[h] == 1
				require.Equal(t, gone, s.dec(h), "step %d", step)
				if model[h] > 0 {
					model[h]--
				}
				if model[h] == 0 {
					delete(model, h)
				}
			}
			if step%97 == 0 {
				require.Equal(t, len(model), s.size())
				for k, n := range model {
					require.Equal(t, n, s.get(k), "step %d key %x", step, k)
				}
			}
		}
		for k := range model {
			for s.get(k) > 0 {
				s.dec(k)
			}
		}
		require.Zero(t, s.size())
		require.False(t, s.has(7))
	}
}
