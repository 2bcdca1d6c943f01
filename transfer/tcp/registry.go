package tcp

import (
	"sync"

	"github.com/kvroute/kvroute/transfer"
)

// registry is the set of memory regions an agent registered. Transfers
// hold its read lock while they touch the memory, so DeregisterMem waits for
// them and no byte moves into or out of memory after its deregistration.
type registry struct {
	mu      sync.RWMutex // protects regions; held for reading during copies
	regions []region
}

// covers reports whether one region of kind holds all of d. The caller
// holds mu.
func covers(regions []region, kind transfer.MemKind, d transfer.Desc) bool {
	for _, r := range regions {
		if r.kind == kind && r.desc.Covers(d) {
			return true
		}
	}
	return false
}

// coversAll returns the index of the first descriptor no region covers, or
// -1 when all are covered.
func coversAll(regions []region, kind transfer.MemKind, ds []transfer.Desc) int {
	for i, d := range ds {
		if !covers(regions, kind, d) {
			return i
		}
	}
	return -1
}

func (r *registry) add(kind transfer.MemKind, ds []transfer.RegDesc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range ds {
		r.regions = append(r.regions, region{kind: kind, desc: d.Desc})
	}
}

// remove deletes one region per descriptor and reports whether all were
// found; it removes nothing otherwise.
func (r *registry) remove(kind transfer.MemKind, ds []transfer.RegDesc) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := append([]region(nil), r.regions...)
	for _, d := range ds {
		found := false
		for i, reg := range keep {
			if reg.kind == kind && reg.desc == d.Desc {
				keep = append(keep[:i], keep[i+1:]...)
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	r.regions = keep
	return true
}

func (r *registry) snapshot() []region {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]region(nil), r.regions...)
}
