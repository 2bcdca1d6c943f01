package router

import (
	"math/bits"

	"github.com/kvroute/kvroute"
)

// keyIndex maps cache domains to positions (in a snapshot's domains or in
// a phase's candidates). It is built once per snapshot and then only read,
// by every decision: an open-addressing table whose hash is one multiply,
// several times cheaper than a general map's hash of a struct key.
type keyIndex struct {
	slots []keySlot // len is a power of two, at most half full
	shift uint8
}

// keySlot is one entry; pos is the position plus one, 0 marks an empty
// slot.
type keySlot struct {
	key kvroute.WorkerKey
	pos int32
}

// newKeyIndex returns an empty index with room for n keys.
func newKeyIndex(n int) keyIndex {
	size := 8
	for size < 2*n {
		size *= 2
	}
	return keyIndex{slots: make([]keySlot, size), shift: uint8(64 - bits.Len(uint(size)-1))}
}

// home returns the preferred slot of k.
func (x *keyIndex) home(k kvroute.WorkerKey) int {
	h := (uint64(k.ID) ^ uint64(k.Rank)<<40 ^ uint64(k.Rank)>>24) * 0x9e3779b97f4a7c15
	return int(h >> x.shift)
}

// put sets the position of k. The index must have room for it (see
// newKeyIndex).
func (x *keyIndex) put(k kvroute.WorkerKey, pos int) {
	mask := len(x.slots) - 1
	i := x.home(k)
	for x.slots[i].pos != 0 && x.slots[i].key != k {
		i = (i + 1) & mask
	}
	x.slots[i] = keySlot{key: k, pos: int32(pos) + 1}
}

// get returns the position of k and whether k is present.
func (x *keyIndex) get(k kvroute.WorkerKey) (int, bool) {
	if len(x.slots) == 0 {
		return 0, false
	}
	mask := len(x.slots) - 1
	for i := x.home(k); ; i = (i + 1) & mask {
		e := &x.slots[i]
		if e.pos == 0 {
			return 0, false
		}
		if e.key == k {
			return int(e.pos) - 1, true
		}
	}
}
