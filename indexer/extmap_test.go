package indexer

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
)

// TestExtMapAgainstBuiltin drives extMap and a built-in map with the same
// random operations, including long runs of consecutive keys, and compares.
func TestExtMapAgainstBuiltin(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	m := newExtMap()
	ref := map[kvroute.ExternalHash]entry{}
	for i := range 200000 {
		var k kvroute.ExternalHash
		if r.IntN(2) == 0 {
			k = kvroute.ExternalHash(r.IntN(5000))
		} else {
			k = kvroute.ExternalHash(r.Uint64())
		}
		switch r.IntN(3) {
		case 0, 1:
			e := entry{id: uint32(i), pos: int32(i % maxPos), tiers: uint8(1 + r.IntN(15))}
			m.put(k, e)
			ref[k] = e
		default:
			m.del(k)
			delete(ref, k)
		}
		if i%10000 == 0 {
			require.Equal(t, len(ref), m.len())
			for k, e := range ref {
				got, ok := m.get(k)
				require.True(t, ok)
				require.Equal(t, e, got)
			}
			seen := 0
			m.all(func(k kvroute.ExternalHash, e entry) {
				seen++
				require.Equal(t, ref[k], e)
			})
			require.Equal(t, len(ref), seen)
		}
	}
	for k := range ref {
		m.del(k)
	}
	require.Zero(t, m.len())
	require.Len(t, m.slots, extMapMinSlots)
	_, ok := m.get(1)
	require.False(t, ok)
}

// put sets the entry for k.
func (m *extMap) put(k kvroute.ExternalHash, e entry) {
	p, _ := m.upsert(k)
	*p = e.pack()
}
