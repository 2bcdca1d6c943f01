package scheduling

import (
	"math/bits"

	"github.com/kvroute/kvroute"
)

// chainSet is the set of active prompt blocks of one worker, kept as a
// compressed trie of the requests' chains of sequence hashes: each segment
// is a run of blocks that every request through it shares, and a request
// holds the path from the root to its leaf segment. Adding or removing a
// request costs one table lookup per segment on its path plus a copy of its
// new blocks, not one hash-table update per block, and asking how many
// leading blocks of a prompt are active costs one lookup per segment the
// prompt shares.
//
// Segments are found by their parent and first block, so the structure
// stays a trie whatever the hashes are; the matching inside a segment
// compares hashes by binary search, which is exact for chained sequence
// hashes (a block's hash names its whole prefix). It is not safe for
// concurrent use; the tracker guards each worker's set with its lock. The
// zero value is empty.
type chainSet struct {
	segs  []segment // by id; segs[0] is the root (no blocks), once used
	free  []int32   // ids of unused segments
	spare [][]kvroute.SeqHash
	table segTable
	size  int // distinct blocks: the sum of the segments' lengths
}

// segment is one run of blocks of the trie.
type segment struct {
	hashes []kvroute.SeqHash
	refs   int32 // requests whose path runs through (or ends in) it
	parent int32
	child  int32 // first child, 0 = none
	next   int32 // next sibling, 0 = none
	prev   int32 // previous sibling, 0 = none (first child)
	nchild int32
}

// maxSpareHashes bounds the recycled hash arrays a set keeps.
const maxSpareHashes = 64

// init makes the root segment.
func (s *chainSet) init() {
	if len(s.segs) == 0 {
		s.segs = append(s.segs, segment{})
	}
}

// newSegment returns the id of an unused segment holding a copy of hashes,
// under parent. It does not link it into the tree.
func (s *chainSet) newSegment(parent int32, hashes []kvroute.SeqHash) int32 {
	var id int32
	if n := len(s.free); n > 0 {
		id = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		id = int32(len(s.segs))
		s.segs = append(s.segs, segment{})
	}
	var buf []kvroute.SeqHash
	if n := len(s.spare); n > 0 {
		buf = s.spare[n-1]
		s.spare = s.spare[:n-1]
	}
	s.segs[id] = segment{hashes: append(buf[:0], hashes...), parent: parent}
	return id
}

// dropSegment returns segment id and its hash array for reuse.
func (s *chainSet) dropSegment(id int32) {
	if h := s.segs[id].hashes; cap(h) > 0 && len(s.spare) < maxSpareHashes {
		s.spare = append(s.spare, h[:0])
	}
	s.segs[id] = segment{}
	s.free = append(s.free, id)
}

// link makes id the first child of parent.
func (s *chainSet) link(parent, id int32) {
	p := &s.segs[parent]
	c := &s.segs[id]
	c.parent, c.prev, c.next = parent, 0, p.child
	if p.child != 0 {
		s.segs[p.child].prev = id
	}
	p.child = id
	p.nchild++
}

// unlink removes id from its parent's children.
func (s *chainSet) unlink(id int32) {
	c := &s.segs[id]
	p := &s.segs[c.parent]
	if c.prev != 0 {
		s.segs[c.prev].next = c.next
	} else {
		p.child = c.next
	}
	if c.next != 0 {
		s.segs[c.next].prev = c.prev
	}
	p.nchild--
	c.prev, c.next = 0, 0
}

// replaceChild puts id in old's place among old's parent's children.
func (s *chainSet) replaceChild(old, id int32) {
	o := &s.segs[old]
	c := &s.segs[id]
	c.parent, c.prev, c.next = o.parent, o.prev, o.next
	if o.prev != 0 {
		s.segs[o.prev].next = id
	} else {
		s.segs[o.parent].child = id
	}
	if o.next != 0 {
		s.segs[o.next].prev = id
	}
	o.prev, o.next = 0, 0
}

// split cuts segment id after its first j blocks (0 < j < its length) and
// returns the id of the new upper segment. The lower part keeps id, its
// children and the requests that end in it; both parts keep id's
// reference count.
func (s *chainSet) split(id int32, j int) int32 {
	// The lower part gets a copy of its blocks in a recycled array; the
	// upper part keeps the original array, so arrays are always used from
	// their start.
	h := s.newSegment(0, s.segs[id].hashes[j:])
	seg, up := &s.segs[id], &s.segs[h]
	lower := up.hashes
	up.hashes, up.refs = seg.hashes[:j], seg.refs
	seg.hashes = lower
	s.replaceChild(id, h)
	s.table.set(up.parent, up.hashes[0], h)
	up.child, up.nchild = id, 1
	seg.parent = h
	s.table.insert(h, lower[0], id)
	return h
}

// mismatch returns the first index at which a and b differ, given that
// a[0] == b[0] and a[n-1] != b[n-1] (n ≤ len(a), len(b)). For chains equal
// up to some index and different after it, that is the branch point.
func mismatch(a, b []kvroute.SeqHash, n int) int {
	lo, hi := 0, n-1 // a[lo] == b[lo], a[hi] != b[hi]
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if a[mid] == b[mid] {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

// walk follows blocks down the trie and returns how many leading blocks
// it holds, the deepest segment it reached and how many of that
// segment's blocks matched (0 when none was reached, and then seg is the
// segment the next block would hang under).
func (s *chainSet) walk(blocks []kvroute.SeqHash) (k int, seg int32, off int) {
	if len(s.segs) == 0 {
		return 0, 0, 0
	}
	n := len(blocks)
	for k < n {
		id := s.table.get(seg, blocks[k])
		if id == 0 {
			return k, seg, 0
		}
		h := s.segs[id].hashes
		m := min(len(h), n-k)
		if h[m-1] == blocks[k+m-1] {
			k += m
			if m < len(h) {
				return k, id, m
			}
			seg = id
			continue
		}
		j := mismatch(h, blocks[k:], m)
		return k + j, id, j
	}
	return k, seg, 0
}

// prefix returns how many leading blocks of blocks are active.
func (s *chainSet) prefix(blocks []kvroute.SeqHash) int {
	k, _, _ := s.walk(blocks)
	return k
}

// add adds a request with the given chain and returns its leaf segment
// (to pass to remove) and how many of its blocks were not active.
func (s *chainSet) add(blocks []kvroute.SeqHash) (leaf int32, added int) {
	s.init()
	k, seg, off := s.walk(blocks)
	if off > 0 && off < len(s.segs[seg].hashes) {
		seg = s.split(seg, off)
	}
	if k < len(blocks) {
		id := s.newSegment(seg, blocks[k:])
		s.link(seg, id)
		s.table.insert(seg, blocks[k], id)
		seg = id
	}
	for x := seg; x != 0; x = s.segs[x].parent {
		s.segs[x].refs++
	}
	added = len(blocks) - k
	s.size += added
	return seg, added
}

// remove removes a request whose leaf segment add returned and returns how
// many blocks are no longer active.
func (s *chainSet) remove(leaf int32) (removed int) {
	if leaf == 0 || int(leaf) >= len(s.segs) {
		return 0
	}
	survivor := int32(0) // deepest segment of the path still in use
	for x := leaf; x != 0; {
		seg := &s.segs[x]
		p := seg.parent
		seg.refs--
		if seg.refs > 0 {
			if survivor == 0 {
				survivor = x
			}
		} else {
			removed += len(seg.hashes)
			s.unlink(x)
			s.table.remove(p, seg.hashes[0])
			s.dropSegment(x)
		}
		x = p
	}
	s.size -= removed
	// The only place where a segment may now have a single child that all
	// of its requests go on to: merge them, so paths stay short.
	if survivor != 0 {
		s.mergeChild(survivor)
	}
	return removed
}

// mergeChild joins segment id with its only child when no request ends in
// id. The merged segment keeps the child's id, so that the leaves of the
// requests stay valid.
func (s *chainSet) mergeChild(id int32) {
	seg := &s.segs[id]
	if seg.nchild != 1 || s.segs[seg.child].refs != seg.refs {
		return
	}
	c := seg.child
	child := &s.segs[c]
	s.table.remove(id, child.hashes[0])
	old := child.hashes
	child.hashes = append(seg.hashes, old...)
	seg.hashes = nil
	if cap(old) > 0 && len(s.spare) < maxSpareHashes {
		s.spare = append(s.spare, old[:0])
	}
	seg.child, seg.nchild = 0, 0
	s.replaceChild(id, c)
	s.table.set(child.parent, child.hashes[0], c)
	s.segs[id] = segment{}
	s.free = append(s.free, id)
}

// len returns the number of distinct active blocks.
func (s *chainSet) len() int { return s.size }

// reset empties the set and releases its memory.
func (s *chainSet) reset() { *s = chainSet{} }

// segTable maps (parent segment, first block hash) to a segment id: an
// open-addressing hash table with linear probing and backward-shift
// deletion. Id 0 (the root) marks an empty slot.
type segTable struct {
	slots []segSlot // len is zero or a power of two
	len   int
	shift uint8
}

// segSlot is one table entry.
type segSlot struct {
	hash   kvroute.SeqHash
	parent int32
	id     int32 // 0 = empty
}

// minSegSlots is the table size on first insert.
const minSegSlots = 16

// home returns the preferred slot of (parent, h).
func (t *segTable) home(parent int32, h kvroute.SeqHash) int {
	return int(((uint64(h) ^ uint64(parent)*0xff51afd7ed558ccd) * splitmixGamma) >> t.shift)
}

// get returns the id under (parent, h), or 0.
func (t *segTable) get(parent int32, h kvroute.SeqHash) int32 {
	if t.len == 0 {
		return 0
	}
	mask := len(t.slots) - 1
	for i := t.home(parent, h); ; i = (i + 1) & mask {
		e := &t.slots[i]
		if e.id == 0 {
			return 0
		}
		if e.hash == h && e.parent == parent {
			return e.id
		}
	}
}

// set replaces the id under (parent, h), which must be present.
func (t *segTable) set(parent int32, h kvroute.SeqHash, id int32) {
	mask := len(t.slots) - 1
	for i := t.home(parent, h); ; i = (i + 1) & mask {
		e := &t.slots[i]
		if e.id == 0 {
			return
		}
		if e.hash == h && e.parent == parent {
			e.id = id
			return
		}
	}
}

// insert adds id under (parent, h), which must be absent.
func (t *segTable) insert(parent int32, h kvroute.SeqHash, id int32) {
	if (t.len+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	mask := len(t.slots) - 1
	i := t.home(parent, h)
	for t.slots[i].id != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = segSlot{hash: h, parent: parent, id: id}
	t.len++
}

// remove deletes the entry under (parent, h), if present.
func (t *segTable) remove(parent int32, h kvroute.SeqHash) {
	if t.len == 0 {
		return
	}
	mask := len(t.slots) - 1
	i := t.home(parent, h)
	for ; ; i = (i + 1) & mask {
		e := &t.slots[i]
		if e.id == 0 {
			return
		}
		if e.hash == h && e.parent == parent {
			break
		}
	}
	// Backward-shift deletion: move later members of the probe run into
	// the hole when the hole lies between their home and their slot.
	for j := i; ; {
		j = (j + 1) & mask
		e := t.slots[j]
		if e.id == 0 {
			break
		}
		if (j-t.home(e.parent, e.hash))&mask >= (j-i)&mask {
			t.slots[i] = e
			i = j
		}
	}
	t.slots[i] = segSlot{}
	t.len--
}

// grow doubles the table (or allocates the first one) and rehashes.
func (t *segTable) grow() {
	old := t.slots
	n := max(len(old)*2, minSegSlots)
	t.slots = make([]segSlot, n)
	t.shift = uint8(64 - bits.Len(uint(n)-1))
	mask := n - 1
	for _, e := range old {
		if e.id == 0 {
			continue
		}
		i := t.home(e.parent, e.hash)
		for t.slots[i].id != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = e
	}
}

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
