package indexer

import (
	"math/bits"

	"github.com/kvroute/kvroute"
)

// parentFilter remembers, with false positives but no false negatives,
// the sequence hashes that are the parent of some head (see blockTable):
// a block stored under a parent that is not in the filter cannot exist as
// a head, so the writer skips the table lookup for it. It is a bit set with
// about eight bits per head, small enough to stay in the CPU caches, and
// is rebuilt from the table when heads have been added faster than its
// size allows; bits of heads that are gone stay set until then.
type parentFilter struct {
	words []uint64
	shift uint // 64 - log2(bits)
	adds  int  // bits set since the last rebuild
}

const minFilterBits = 1 << 12

func newParentFilter(heads int) parentFilter {
	n := max(minFilterBits, 1<<bits.Len(uint(8*heads)))
	return parentFilter{words: make([]uint64, n/64), shift: uint(64 - bits.TrailingZeros(uint(n)))}
}

func (f *parentFilter) bit(p kvroute.SeqHash) (int, uint64) {
	b := (uint64(p) * 0x9e3779b97f4a7c15) >> f.shift
	return int(b / 64), 1 << (b % 64)
}

// add records p.
func (f *parentFilter) add(p kvroute.SeqHash) {
	w, m := f.bit(p)
	if f.words[w]&m == 0 {
		f.words[w] |= m
		f.adds++
	}
}

// mayHave reports whether p may have been added.
func (f *parentFilter) mayHave(p kvroute.SeqHash) bool {
	w, m := f.bit(p)
	return f.words[w]&m != 0
}

// full reports whether a quarter of the bits are set, so that lookups
// would mostly go to the table anyway.
func (f *parentFilter) full() bool { return f.adds*4 > len(f.words)*64 }
