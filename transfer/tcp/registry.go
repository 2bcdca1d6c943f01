package tcp

import (
	"slices"
	"sync"

	"github.com/kvroute/kvroute/transfer"
)

// registry is the set of memory regions an agent registered.
//
// A transfer pins the regions its descriptors lie in for as long as bytes
// move into or out of them; no lock is held meanwhile, so a transfer
// stalled on the network delays only the deregistration of the memory it
// uses. remove takes a region out at once, so no new transfer can pin it,
// and returns once its last pin is gone: no byte moves into or out of
// memory after its deregistration returned.
type registry struct {
	mu      sync.Mutex // protects regions and every entry's pins and drained
	regions regionIndex[*regEntry]
}

// regEntry is one registered region and the transfers using it.
type regEntry struct {
	region
	// pins counts the transfers copying into or out of the region.
	pins int
	// drained is set when the region is deregistered while pinned, and
	// closed when its last pin goes.
	drained chan struct{}
}

// pins is the set of regions one transfer pinned: nearly always one, held
// without an allocation.
type pins struct {
	first *regEntry
	more  []*regEntry
}

// add adds e unless it is there already, and reports whether it added it.
func (p *pins) add(e *regEntry) bool {
	if p.first == nil {
		p.first = e
		return true
	}
	if p.first == e || slices.Contains(p.more, e) {
		return false
	}
	p.more = append(p.more, e)
	return true
}

// each calls f for every pinned region.
func (p *pins) each(f func(*regEntry)) {
	if p.first != nil {
		f(p.first)
	}
	for _, e := range p.more {
		f(e)
	}
}

// find returns the region of kind holding all of d, or nil. The caller
// holds mu.
func (r *registry) find(kind transfer.MemKind, d transfer.Desc) *regEntry {
	if i := r.regions.find(kind, d); i >= 0 {
		return r.regions.vals[i]
	}
	return nil
}

// uncovered returns the index of the first descriptor no registered region
// covers, or -1 when all are covered.
func (r *registry) uncovered(kind transfer.MemKind, ds []transfer.Desc) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.regions.firstUncovered(kind, ds)
}

// pin pins the regions holding ds, so that they stay registered until
// unpin. It returns the index of the first descriptor no region covers,
// pinning nothing, or -1.
func (r *registry) pin(kind transfer.MemKind, ds []transfer.Desc) (pins, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var p pins
	for i, d := range ds {
		e := r.find(kind, d)
		if e == nil {
			return pins{}, i
		}
		p.add(e)
	}
	p.each(func(e *regEntry) { e.pins++ })
	return p, -1
}

// unpin releases what pin returned.
func (r *registry) unpin(p pins) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p.each(func(e *regEntry) {
		e.pins--
		if e.pins == 0 && e.drained != nil {
			close(e.drained)
		}
	})
}

// add registers one region per descriptor.
func (r *registry) add(kind transfer.MemKind, ds []transfer.RegDesc) {
	regs := make([]region, len(ds))
	entries := make([]*regEntry, len(ds))
	for i, d := range ds {
		regs[i] = region{kind: kind, desc: d.Desc}
		entries[i] = &regEntry{region: regs[i]}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.regions.add(regs, entries)
}

// remove deletes one region per descriptor and reports whether all were
// found; it removes nothing otherwise. It returns once no transfer uses
// the removed regions any more.
func (r *registry) remove(kind transfer.MemKind, ds []transfer.RegDesc) bool {
	gs := make([]region, len(ds))
	for i, d := range ds {
		gs[i] = region{kind: kind, desc: d.Desc}
	}
	r.mu.Lock()
	gone, found := r.regions.take(gs)
	if !found {
		r.mu.Unlock()
		return false
	}
	var wait []chan struct{}
	for _, e := range gone {
		if e.pins > 0 {
			e.drained = make(chan struct{})
			wait = append(wait, e.drained)
		}
	}
	r.mu.Unlock()
	for _, ch := range wait {
		<-ch
	}
	return true
}

// snapshot returns the registered regions.
func (r *registry) snapshot() []region {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.regions.regs)
}

// count returns the number of registered regions.
func (r *registry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.regions.len()
}
