package scheduling

import (
	"math/bits"

	"github.com/kvroute/kvroute"
)

// blockCounts is a reference-counted set of sequence hashes: an
// open-addressing hash table with linear probing and backward-shift
// deletion (no tombstones), specialised for the tracker's hot path.
//
// Sequence hashes are XXH3 outputs, but a Fibonacci multiply still spreads
// keys that hosts derive some other way. Key 0 marks an empty slot, so the
// count of hash 0 is kept aside. Lookups touch one or two cache lines at
// the load factor kept here (at most 3/4), which makes them several times
// faster than a general map. The zero value is an empty set. It is not safe
// for concurrent use; the tracker guards each worker's set with its lock.
type blockCounts struct {
	slots []blockSlot // len is zero or a power of two
	len   int         // occupied slots
	shift uint8       // 64 − log2(len(slots))
	zero  int32       // count of hash 0
}

// blockSlot is one table entry; hash 0 means empty.
type blockSlot struct {
	hash  kvroute.SeqHash
	count int32
}

// minBlockSlots is the table size on first insert.
const minBlockSlots = 64

// home returns the preferred slot of h.
func (s *blockCounts) home(h kvroute.SeqHash) int {
	return int((uint64(h) * splitmixGamma) >> s.shift)
}

// get returns the count of h.
func (s *blockCounts) get(h kvroute.SeqHash) int32 {
	if h == 0 {
		return s.zero
	}
	if s.len == 0 {
		return 0
	}
	mask := len(s.slots) - 1
	for i := s.home(h); ; i = (i + 1) & mask {
		switch e := &s.slots[i]; e.hash {
		case h:
			return e.count
		case 0:
			return 0
		}
	}
}

// has reports whether h is in the set.
func (s *blockCounts) has(h kvroute.SeqHash) bool { return s.get(h) != 0 }

// inc adds one reference to h and reports whether h was absent.
func (s *blockCounts) inc(h kvroute.SeqHash) bool {
	if h == 0 {
		s.zero++
		return s.zero == 1
	}
	if (s.len+1)*4 > len(s.slots)*3 {
		s.grow()
	}
	mask := len(s.slots) - 1
	for i := s.home(h); ; i = (i + 1) & mask {
		e := &s.slots[i]
		switch e.hash {
		case h:
			e.count++
			return false
		case 0:
			*e = blockSlot{hash: h, count: 1}
			s.len++
			return true
		}
	}
}

// dec removes one reference to h and reports whether h is now absent. A
// hash that is not in the set is left alone and reports false.
func (s *blockCounts) dec(h kvroute.SeqHash) bool {
	if h == 0 {
		if s.zero == 0 {
			return false
		}
		s.zero--
		return s.zero == 0
	}
	if s.len == 0 {
		return false
	}
	mask := len(s.slots) - 1
	i := s.home(h)
	for ; ; i = (i + 1) & mask {
		e := &s.slots[i]
		if e.hash == 0 {
			return false
		}
		if e.hash == h {
			if e.count > 1 {
				e.count--
				return false
			}
			break
		}
	}
	// Backward-shift deletion: move later members of the probe run into
	// the hole when the hole lies between their home and their slot.
	for j := i; ; {
		j = (j + 1) & mask
		e := s.slots[j]
		if e.hash == 0 {
			break
		}
		if (j-s.home(e.hash))&mask >= (j-i)&mask {
			s.slots[i] = e
			i = j
		}
	}
	s.slots[i] = blockSlot{}
	s.len--
	return true
}

// grow doubles the table (or allocates the first one) and rehashes.
func (s *blockCounts) grow() {
	old := s.slots
	n := max(len(old)*2, minBlockSlots)
	s.slots = make([]blockSlot, n)
	s.shift = uint8(64 - bits.Len(uint(n)-1))
	mask := n - 1
	for _, e := range old {
		if e.hash == 0 {
			continue
		}
		i := s.home(e.hash)
		for s.slots[i].hash != 0 {
			i = (i + 1) & mask
		}
		s.slots[i] = e
	}
}

// size returns the number of distinct hashes in the set.
func (s *blockCounts) size() int {
	if s.zero > 0 {
		return s.len + 1
	}
	return s.len
}

// reset empties the set and releases its table.
func (s *blockCounts) reset() { *s = blockCounts{} }

// workerTable is an immutable open-addressing map from worker key to its
// tracked state, rebuilt on every change (workers come and go rarely) and
// read without locks. Its hash is one multiply of the key's two fields,
// several times cheaper than a general map's hash of a struct key.
type workerTable struct {
	slots []workerSlot // len is a power of two, at most half full
	shift uint8
	n     int
}

// workerSlot is one entry; a nil state marks an empty slot.
type workerSlot struct {
	key   kvroute.WorkerKey
	state *workerState
}

// newWorkerTable returns a table holding the states of m.
func newWorkerTable(m map[kvroute.WorkerKey]*workerState) *workerTable {
	size := 8
	for size < 2*len(m) {
		size *= 2
	}
	t := &workerTable{slots: make([]workerSlot, size), shift: uint8(64 - bits.Len(uint(size)-1)), n: len(m)}
	for k, ws := range m {
		i := t.home(k)
		for t.slots[i].state != nil {
			i = (i + 1) & (size - 1)
		}
		t.slots[i] = workerSlot{key: k, state: ws}
	}
	return t
}

// home returns the preferred slot of k.
func (t *workerTable) home(k kvroute.WorkerKey) int {
	h := (uint64(k.ID) ^ uint64(k.Rank)<<40 ^ uint64(k.Rank)>>24) * splitmixGamma
	return int(h >> t.shift)
}

// get returns the state of k, or nil.
func (t *workerTable) get(k kvroute.WorkerKey) *workerState {
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		e := &t.slots[i]
		if e.state == nil || e.key == k {
			return e.state
		}
	}
}

// all returns the table's contents as a map, for building the next table.
func (t *workerTable) all() map[kvroute.WorkerKey]*workerState {
	m := make(map[kvroute.WorkerKey]*workerState, t.n+1)
	for _, e := range t.slots {
		if e.state != nil {
			m[e.key] = e.state
		}
	}
	return m
}
