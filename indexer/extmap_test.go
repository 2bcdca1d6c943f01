package indexer

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
)

// placements are the two ways a new key takes a slot (extMap.upsertAt).
var placements = []struct {
	name string
	home bool
}{{"first empty slot of the group", false}, {"home slot", true}}

// TestExtMapAgainstBuiltin drives extMap and a built-in map with the same
// random operations, including long runs of consecutive keys, and compares,
// for both placements of new keys.
func TestExtMapAgainstBuiltin(t *testing.T) {
	for _, pl := range placements {
		t.Run(pl.name, func(t *testing.T) { testExtMapAgainstBuiltin(t, pl.home) })
	}
}

func testExtMapAgainstBuiltin(t *testing.T, home bool) {
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
		switch r.IntN(4) {
		case 0, 1:
			e := entry{id: uint32(i), pos: int32(i % maxPos), tiers: uint8(1 + r.IntN(15))}
			m.putAt(k, e, home)
			ref[k] = e
		case 2:
			m.del(k)
			delete(ref, k)
		default:
			// take a tier or two off, deleting the entry with its last
			mask := uint8(1+r.IntN(15)) & uint8(1+r.IntN(15))
			got, ok := m.take(k, mask)
			want, had := ref[k]
			if !had || want.tiers&mask == 0 {
				require.False(t, ok)
				break
			}
			require.True(t, ok)
			require.Equal(t, want, got)
			if want.tiers &^= mask; want.tiers == 0 {
				delete(ref, k)
			} else {
				ref[k] = want
			}
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

// del removes k, whatever its tiers.
func (m *extMap) del(k kvroute.ExternalHash) { m.take(k, ^uint8(0)) }

// put sets the entry for k.
func (m *extMap) put(k kvroute.ExternalHash, e entry) { m.putAt(k, e, false) }

// putAt sets the entry for k, placing a new key as upsertAt does.
func (m *extMap) putAt(k kvroute.ExternalHash, e entry, home bool) {
	p, _ := m.upsertAt(k, home)
	*p = e.pack()
}

// TestExtMapFullGroupsAndTombstones fills small tables with keys whose
// home is the last group, so that they overflow it and probes wrap around
// to the first group, then deletes them in an order that leaves
// tombstones in the full group, and checks every remaining key after
// each step, the tombstones' reuse and the table's counts, for both
// placements of new keys.
func TestExtMapFullGroupsAndTombstones(t *testing.T) {
	for _, pl := range placements {
		t.Run(pl.name, func(t *testing.T) { testExtMapFullGroupsAndTombstones(t, pl.home) })
	}
}

func testExtMapFullGroupsAndTombstones(t *testing.T, home bool) {
	for _, size := range []int{16, 32, 64} {
		m := newExtMap()
		m.resize(size)
		var keys []kvroute.ExternalHash
		for k := kvroute.ExternalHash(1); len(keys) < size*maxLoadNum/maxLoadDen-1; k++ {
			if m.hash(k) >= size-groupWidth {
				keys = append(keys, k)
			}
		}
		for i, k := range keys {
			m.putAt(k, entry{id: uint32(i), pos: 1, tiers: 1}, home)
		}
		require.Len(t, m.slots, size, "the table must not have grown")
		require.Zero(t, matchEmpty(m.group(size-groupWidth)), "the last group is full")
		checkCounts := func() {
			t.Helper()
			tombs := 0
			for _, c := range m.ctrl {
				if c == ctrlDeleted {
					tombs++
				}
			}
			require.Equal(t, loadLimit(len(m.slots))-m.count-tombs, m.room)
		}
		left := map[int]bool{}
		for i := range keys {
			left[i] = true
		}
		check := func(gone int) {
			t.Helper()
			checkCounts()
			for i := range left {
				got, ok := m.get(keys[i])
				require.True(t, ok, "key %d lost after deleting %d", i, gone)
				require.Equal(t, uint32(i), got.id)
			}
			_, ok := m.get(keys[gone])
			require.False(t, ok)
		}
		// Keys 0-7 fill the last group; deleting one of them while the
		// group is full leaves a tombstone that probes for the keys that
		// wrapped to the first group pass over.
		at := m.find(keys[3])
		require.GreaterOrEqual(t, at, size-groupWidth, "key 3 is in the last group")
		m.del(keys[3])
		delete(left, 3)
		require.Equal(t, uint8(ctrlDeleted), m.ctrl[at])
		check(3)
		// Inserting a key again reuses the tombstone.
		room := m.room
		m.putAt(keys[3], entry{id: 3, pos: 1, tiers: 1}, home)
		left[3] = true
		require.Equal(t, room, m.room)
		checkCounts()
		// Delete the keys that wrapped first, then the rest.
		for i := len(keys) - 1; i >= 0; i-- {
			m.del(keys[i])
			delete(left, i)
			check(i)
		}
		require.Zero(t, m.len())
	}
}

// TestExtMapReserve checks the sizes reserve gives and that a reserved
// table neither grows while it fills to the reservation nor shrinks below
// it when emptied or reset, and answers like a built-in map throughout.
func TestExtMapReserve(t *testing.T) {
	for _, c := range []struct{ keys, slots int }{
		{-1, extMapMinSlots}, {0, extMapMinSlots}, {1, extMapMinSlots}, {5, extMapMinSlots},
		{6, 16}, {10, 16}, {11, 32}, {8192, 16384}, {1 << 30, 1 << 23},
	} {
		require.Equal(t, c.slots, slotsFor(max(c.keys, 1)), "slotsFor(%d)", c.keys)
	}
	r := rand.New(rand.NewPCG(3, 4))
	const keys = 3000
	m := newExtMap()
	m.put(7, entry{id: 7, pos: 7, tiers: 1})
	m.reserve(keys)
	require.Len(t, m.slots, slotsFor(keys), "reserve grows the table now")
	got, ok := m.get(7)
	require.True(t, ok, "the key inserted before survives the growth")
	require.Equal(t, entry{id: 7, pos: 7, tiers: 1}, got)
	ref := map[kvroute.ExternalHash]entry{7: got}
	for len(ref) < keys {
		k := kvroute.ExternalHash(r.Uint64())
		e := entry{id: uint32(len(ref)), pos: 1, tiers: 2}
		m.put(k, e)
		ref[k] = e
		require.Len(t, m.slots, slotsFor(keys), "the table grew before holding its reservation")
	}
	for k, e := range ref {
		got, ok := m.get(k)
		require.True(t, ok)
		require.Equal(t, e, got)
		m.del(k)
	}
	require.Zero(t, m.len())
	require.Len(t, m.slots, slotsFor(keys), "an emptied table keeps its reserved size")
	m.put(1, entry{tiers: 1})
	m.reset()
	require.Len(t, m.slots, slotsFor(keys), "reset keeps the reserved size")
	_, ok = m.get(1)
	require.False(t, ok)

	m.reserve(0)
	m.put(1, entry{tiers: 1})
	m.del(1)
	require.Len(t, m.slots, slotsFor(keys)/2, "without a reservation an empty table halves on a deletion")
}
