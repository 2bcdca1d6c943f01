package indexer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/internal/clocktest"
)

func insert(t *testing.T, a *indexer.Approx, w kvroute.WorkerKey, tokens []uint32) {
	t.Helper()
	_, seqs := testHasher.AppendHashes(nil, nil, tokens)
	a.Insert(w, seqs)
}

func TestApproxTTL(t *testing.T) {
	clock := clocktest.New(time.Unix(1000, 0))
	a, err := indexer.NewApprox(indexer.ApproxConfig{Clock: clock, Index: indexer.Config{Hasher: testHasher}})
	require.NoError(t, err)

	insert(t, a, wk(1), prompt(1, 2, 3))
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{wk(1): dev(3)}, matchMap(a.Index, prompt(1, 2, 3, 4)))

	clock.Advance(60 * time.Second)
	insert(t, a, wk(1), prompt(1, 2)) // refreshes the first two blocks
	require.Equal(t, 3, a.Len())

	clock.Advance(61 * time.Second) // the third block is now 121 s old
	require.Equal(t, 1, a.Expire())
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{wk(1): dev(2)}, matchMap(a.Index, prompt(1, 2, 3)))

	clock.Advance(60 * time.Second) // default TTL is 120 s
	require.Equal(t, 2, a.Expire())
	require.Equal(t, 0, a.Len())
	require.Equal(t, 0, a.Size().Pairs)
	require.Equal(t, 0, a.Size().Blocks)
}

func TestApproxPrunesOldestLeavesFirst(t *testing.T) {
	clock := clocktest.New(time.Unix(0, 0))
	a, err := indexer.NewApprox(indexer.ApproxConfig{Clock: clock, MaxBlocks: 10, Index: indexer.Config{Hasher: testHasher}})
	require.NoError(t, err)

	insert(t, a, wk(1), prompt(1, 2, 3, 4)) // t=0
	clock.Advance(time.Second)
	insert(t, a, wk(2), prompt(1, 2, 3)) // t=1
	clock.Advance(time.Second)
	insert(t, a, wk(3), prompt(7, 8, 9)) // t=2: 10 pairs, at the bound
	require.Equal(t, 10, a.Len())
	clock.Advance(time.Second)
	insert(t, a, wk(4), prompt(5)) // 11 > 10: prune to 8, oldest first

	require.Equal(t, 8, a.Len())
	// Worker 1's three deepest blocks went first: leaves before parents.
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{wk(1): dev(1), wk(2): dev(3)}, matchMap(a.Index, prompt(1, 2, 3, 4)))
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{wk(4): dev(1)}, matchMap(a.Index, prompt(5)))

	require.True(t, a.RemoveWorker(wk(2)))
	require.Equal(t, 5, a.Len())
	a.ResetWorker(wk(3))
	require.Equal(t, 2, a.Len())
	require.Equal(t, 2, a.Size().Pairs)
}

func TestApproxConfigAndErrors(t *testing.T) {
	_, err := indexer.NewApprox(indexer.ApproxConfig{TTL: -time.Second})
	require.Error(t, err)
	_, err = indexer.NewApprox(indexer.ApproxConfig{PruneTarget: 1.5})
	require.Error(t, err)
	_, err = indexer.NewApprox(indexer.ApproxConfig{})
	require.NoError(t, err)
}
