package tcp

import (
	"cmp"
	"slices"

	"github.com/kvroute/kvroute/transfer"
)

// end returns the end of g's range. Regions never wrap: registrations and
// loaded metadata are checked.
func (g *region) end() uintptr { return g.desc.Addr + uintptr(g.desc.Len) }

// compareRegions orders regions by memory kind, device, start and end.
func compareRegions(a, b region) int {
	return cmp.Or(
		cmp.Compare(a.kind, b.kind),
		cmp.Compare(a.desc.DevID, b.desc.DevID),
		cmp.Compare(a.desc.Addr, b.desc.Addr),
		cmp.Compare(a.desc.Len, b.desc.Len),
	)
}

// sameSpace reports whether a and b are of one memory kind and device, so
// that one can hold the other's ranges.
func sameSpace(a, b *region) bool { return a.kind == b.kind && a.desc.DevID == b.desc.DevID }

// regionIndex finds the region holding a descriptor in O(log n), also
// among overlapping regions. Each region carries a value of type V.
//
// regs are sorted by compareRegions, equal regions in the order they were
// added; vals[i] is regs[i]'s value. reach[i] is the index of the region
// reaching furthest (the largest end, the first of equal ones) among the
// regions of regs[i]'s kind and device up to i. The regions starting at or
// before a descriptor are a prefix of its kind and device's run, so the one
// reaching furthest among them holds the descriptor if any does.
type regionIndex[V any] struct {
	regs  []region
	vals  []V
	reach []int
}

// len returns the number of regions.
func (x *regionIndex[V]) len() int { return len(x.regs) }

// rebuild recomputes reach from index from on.
func (x *regionIndex[V]) rebuild(from int) {
	if cap(x.reach) < len(x.regs) {
		x.reach = slices.Grow(x.reach[:from], len(x.regs)-from)
	}
	x.reach = x.reach[:len(x.regs)]
	for i := from; i < len(x.regs); i++ {
		x.reach[i] = i
		if i > 0 {
			if prev := &x.regs[x.reach[i-1]]; sameSpace(prev, &x.regs[i]) && prev.end() >= x.regs[i].end() {
				x.reach[i] = x.reach[i-1]
			}
		}
	}
}

// find returns the index of a region of kind holding all of d, or -1.
func (x *regionIndex[V]) find(kind transfer.MemKind, d transfer.Desc) int {
	dEnd, ok := d.End()
	if !ok {
		return -1
	}
	// n is the number of regions ordered at or before d's start.
	n, hi := 0, len(x.regs)
	for n < hi {
		m := int(uint(n+hi) >> 1)
		g := &x.regs[m]
		var before bool
		switch {
		case g.kind != kind:
			before = g.kind < kind
		case g.desc.DevID != d.DevID:
			before = g.desc.DevID < d.DevID
		default:
			before = g.desc.Addr <= d.Addr
		}
		if before {
			n = m + 1
		} else {
			hi = m
		}
	}
	if n == 0 {
		return -1
	}
	if g := &x.regs[n-1]; g.kind != kind || g.desc.DevID != d.DevID {
		return -1
	}
	best := x.reach[n-1]
	if x.regs[best].end() < dEnd {
		return -1
	}
	return best
}

// firstUncovered returns the index of the first descriptor no region
// holds, or -1 when all are held.
func (x *regionIndex[V]) firstUncovered(kind transfer.MemKind, ds []transfer.Desc) int {
	for i, d := range ds {
		if x.find(kind, d) < 0 {
			return i
		}
	}
	return -1
}

// add adds regions with their values, after the equal regions there
// already. It keeps neither slice.
func (x *regionIndex[V]) add(regs []region, vals []V) {
	order := make([]int, len(regs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return compareRegions(regs[a], regs[b]) })
	n := len(x.regs) + len(regs)
	mr, mv := make([]region, 0, n), make([]V, 0, n)
	first := n
	i := 0
	for _, j := range order {
		for i < len(x.regs) && compareRegions(x.regs[i], regs[j]) <= 0 {
			mr, mv = append(mr, x.regs[i]), append(mv, x.vals[i])
			i++
		}
		first = min(first, len(mr))
		mr, mv = append(mr, regs[j]), append(mv, vals[j])
	}
	mr, mv = append(mr, x.regs[i:]...), append(mv, x.vals[i:]...)
	x.regs, x.vals = mr, mv
	x.rebuild(first)
}

// take removes one region equal to each of gs (the first added of equal
// ones) and returns their values, or removes nothing and returns false
// when one of gs has no region left.
func (x *regionIndex[V]) take(gs []region) ([]V, bool) {
	picked := make(map[int]bool, len(gs))
	for _, g := range gs {
		i, found := slices.BinarySearchFunc(x.regs, g, compareRegions)
		for found && picked[i] {
			i++
			found = i < len(x.regs) && x.regs[i] == g
		}
		if !found {
			return nil, false
		}
		picked[i] = true
	}
	n := len(x.regs) - len(gs)
	kr, kv := make([]region, 0, n), make([]V, 0, n)
	taken := make([]V, 0, len(gs))
	first := n
	for i := range x.regs {
		if picked[i] {
			first = min(first, len(kr))
			taken = append(taken, x.vals[i])
			continue
		}
		kr, kv = append(kr, x.regs[i]), append(kv, x.vals[i])
	}
	x.regs, x.vals = kr, kv
	x.rebuild(first)
	return taken, true
}
