package tcp

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/transfer"
)

func TestRegionIndexFind(t *testing.T) {
	dram := func(addr uintptr, n uint64, dev uint64) region {
		return region{kind: transfer.DRAM, desc: transfer.Desc{Addr: addr, Len: n, DevID: dev}}
	}
	// Overlapping regions: a long one early, short ones inside and after.
	var x regionIndex[struct{}]
	regs := []region{
		dram(0x1000, 0x100, 0), dram(0x1000, 0x10000, 0), dram(0x2000, 0x10, 0),
		dram(0x20000, 0x100, 0), dram(0x1000, 0x100, 1),
		{kind: transfer.VRAM, desc: transfer.Desc{Addr: 0x50000, Len: 0x100}},
	}
	x.add(regs, make([]struct{}, len(regs)))
	for _, tc := range []struct {
		name string
		kind transfer.MemKind
		d    transfer.Desc
		want region // zero when no region holds d
	}{
		{"inside the first and the long", transfer.DRAM, transfer.Desc{Addr: 0x1000, Len: 0x80}, dram(0x1000, 0x10000, 0)},
		{"past a short region, inside the long one", transfer.DRAM, transfer.Desc{Addr: 0x2008, Len: 0x100}, dram(0x1000, 0x10000, 0)},
		{"the long one exactly", transfer.DRAM, transfer.Desc{Addr: 0x1000, Len: 0x10000}, dram(0x1000, 0x10000, 0)},
		{"one byte past the long one", transfer.DRAM, transfer.Desc{Addr: 0x1000, Len: 0x10001}, region{}},
		{"between regions", transfer.DRAM, transfer.Desc{Addr: 0x11000, Len: 1}, region{}},
		{"the last region", transfer.DRAM, transfer.Desc{Addr: 0x200ff, Len: 1}, dram(0x20000, 0x100, 0)},
		{"straddles the last region's end", transfer.DRAM, transfer.Desc{Addr: 0x200ff, Len: 2}, region{}},
		{"before every region", transfer.DRAM, transfer.Desc{Addr: 0x10, Len: 1}, region{}},
		{"another device", transfer.DRAM, transfer.Desc{Addr: 0x1010, Len: 0x10, DevID: 1}, dram(0x1000, 0x100, 1)},
		{"another device, past its region", transfer.DRAM, transfer.Desc{Addr: 0x1100, Len: 0x10, DevID: 1}, region{}},
		{"a device without regions", transfer.DRAM, transfer.Desc{Addr: 0x1000, Len: 1, DevID: 7}, region{}},
		{"another kind", transfer.VRAM, transfer.Desc{Addr: 0x1000, Len: 1}, region{}},
		{"the VRAM region", transfer.VRAM, transfer.Desc{Addr: 0x50010, Len: 0x10}, region{kind: transfer.VRAM, desc: transfer.Desc{Addr: 0x50000, Len: 0x100}}},
		{"wraps", transfer.DRAM, transfer.Desc{Addr: ^uintptr(0), Len: 2}, region{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := x.find(tc.kind, tc.d)
			if tc.want == (region{}) {
				if i >= 0 {
					t.Fatalf("found %+v, want none", x.regs[i])
				}
				return
			}
			if i < 0 || x.regs[i] != tc.want {
				t.Fatalf("found index %d, want %+v", i, tc.want)
			}
		})
	}
}

// TestRegionIndexRandom checks the index against a scan of every region,
// through random additions and removals of overlapping regions.
func TestRegionIndexRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randRegion := func() region {
		kind := transfer.DRAM
		if rng.IntN(5) == 0 {
			kind = transfer.VRAM
		}
		return region{kind: kind, desc: transfer.Desc{
			Addr: uintptr(1 + rng.IntN(1<<12)), Len: uint64(1 + rng.IntN(1<<9)), DevID: uint64(rng.IntN(2))}}
	}
	var x regionIndex[*regEntry]
	var all []*regEntry // the same regions, in the order they were added
	for step := range 3000 {
		switch {
		case rng.IntN(3) > 0 || len(all) == 0:
			batch := make([]*regEntry, 1+rng.IntN(3))
			for i := range batch {
				batch[i] = &regEntry{region: randRegion()}
				if i > 0 && rng.IntN(4) == 0 {
					batch[i].region = batch[0].region // registered twice
				}
			}
			all = append(all, batch...)
			regs := make([]region, len(batch))
			for i, e := range batch {
				regs[i] = e.region
			}
			x.add(regs, batch)
		case rng.IntN(8) == 0:
			// A removal naming a region never added takes nothing.
			gs := []region{all[rng.IntN(len(all))].region, {kind: transfer.DRAM, desc: transfer.Desc{Addr: 1 << 40, Len: 1}}}
			before := slices.Clone(x.vals)
			if _, ok := x.take(gs); ok || !slices.Equal(before, x.vals) {
				t.Fatalf("step %d: take of an unknown region: ok %v, index changed %v", step, ok, !slices.Equal(before, x.vals))
			}
		default:
			g := all[rng.IntN(len(all))].region
			gs := []region{g}
			copies := 0
			for _, e := range all {
				if e.region == g {
					copies++
				}
			}
			if copies > 1 && rng.IntN(2) == 0 {
				gs = append(gs, g) // two registrations of a region registered more than once
			}
			taken, ok := x.take(gs)
			if !ok || len(taken) != len(gs) {
				t.Fatalf("step %d: take %v: ok %v, %d taken", step, gs, ok, len(taken))
			}
			for _, e := range taken {
				// The first added of equal regions goes first.
				i := slices.IndexFunc(all, func(a *regEntry) bool { return a.region == e.region })
				if all[i] != e {
					t.Fatalf("step %d: took a later registration of %+v", step, e.region)
				}
				all = slices.Delete(all, i, i+1)
			}
		}
		if x.len() != len(all) || len(x.vals) != len(all) {
			t.Fatalf("step %d: %d regions and %d values, want %d", step, x.len(), len(x.vals), len(all))
		}
		for i, e := range x.vals {
			if e.region != x.regs[i] {
				t.Fatalf("step %d: region %d is %+v, its value's %+v", step, i, x.regs[i], e.region)
			}
		}
		for range 20 {
			q := randRegion()
			want := slices.ContainsFunc(all, func(e *regEntry) bool { return e.kind == q.kind && e.desc.Covers(q.desc) })
			i := x.find(q.kind, q.desc)
			if (i >= 0) != want {
				t.Fatalf("step %d: find %+v = %d, a region holds it: %v", step, q, i, want)
			}
			if i >= 0 && (x.regs[i].kind != q.kind || !x.regs[i].desc.Covers(q.desc)) {
				t.Fatalf("step %d: find %+v returned %+v, which does not hold it", step, q, x.regs[i])
			}
		}
	}
}
