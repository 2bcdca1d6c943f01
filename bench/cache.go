package bench

import "github.com/kvroute/kvroute"

// cacheBlock is one full KV block held by a simulated engine, named by the
// chained sequence hash of the prefix it ends.
type cacheBlock struct {
	seq  kvroute.SeqHash
	refs int // running requests using the block
	// prev and next link the block into the LRU list while refs is zero.
	prev, next *cacheBlock
}

// prefixCache is an engine's KV cache: a fixed number of blocks, some
// holding reusable prefix blocks (named by sequence hash) and some private
// to running requests (partial blocks and output not yet full). Blocks no
// running request uses stay cached and are evicted least recently used
// first, as vLLM's free block queue does.
//
// It is owned by one engine and not safe for concurrent use.
type prefixCache struct {
	capacity int
	used     int // named blocks plus private blocks
	blocks   map[kvroute.SeqHash]*cacheBlock
	// lru is a sentinel of the circular list of unreferenced blocks:
	// lru.next is the next to evict.
	lru       cacheBlock
	evictable int
	// free keeps evicted block structs for reuse.
	free []*cacheBlock
}

func newPrefixCache(capacity int) *prefixCache {
	c := &prefixCache{capacity: capacity, blocks: make(map[kvroute.SeqHash]*cacheBlock, capacity)}
	c.lru.prev, c.lru.next = &c.lru, &c.lru
	return c
}

// match returns how many leading blocks of seqs the cache holds, looking at
// no more than limit blocks.
func (c *prefixCache) match(seqs []kvroute.SeqHash, limit int) int {
	n := 0
	for n < limit && n < len(seqs) {
		if _, ok := c.blocks[seqs[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// available returns the blocks that can be allocated after pinning the
// first hit blocks of seqs: free blocks plus evictable ones not among them.
func (c *prefixCache) available(seqs []kvroute.SeqHash, hit int) int {
	n := c.capacity - c.used + c.evictable
	for _, s := range seqs[:hit] {
		if c.blocks[s].refs == 0 {
			n--
		}
	}
	return n
}

// pin adds a reference to the named block, taking it off the LRU list.
func (c *prefixCache) pin(b *cacheBlock) {
	if b.refs == 0 {
		b.prev.next, b.next.prev = b.next, b.prev
		b.prev, b.next = nil, nil
		c.evictable--
	}
	b.refs++
}

// unpin drops a reference; a block left unreferenced becomes the most
// recently used evictable block.
func (c *prefixCache) unpin(b *cacheBlock) {
	b.refs--
	if b.refs > 0 {
		return
	}
	b.prev, b.next = c.lru.prev, &c.lru
	c.lru.prev.next = b
	c.lru.prev = b
	c.evictable++
}

// reserve makes room for n more blocks, evicting least recently used
// unreferenced blocks, and counts them as used. evicted is called with the
// sequence hash of every block it evicts. It reports false, evicting
// nothing, when n blocks cannot be found.
func (c *prefixCache) reserve(n int, evicted func(kvroute.SeqHash)) bool {
	if n > c.capacity-c.used+c.evictable {
		return false
	}
	for c.capacity-c.used < n {
		b := c.lru.next
		b.prev.next, b.next.prev = b.next, b.prev
		b.prev, b.next = nil, nil
		c.evictable--
		c.used--
		delete(c.blocks, b.seq)
		evicted(b.seq)
		c.free = append(c.free, b)
	}
	c.used += n
	return true
}

// forceReserve counts n more blocks as used even beyond the capacity, for
// a request longer than the whole cache that an otherwise idle engine runs
// anyway. It evicts every evictable block first.
func (c *prefixCache) forceReserve(n int, evicted func(kvroute.SeqHash)) {
	room := min(n, c.capacity-c.used+c.evictable)
	if room > 0 {
		c.reserve(room, evicted)
	}
	c.used += n - max(room, 0)
}

// release returns n private blocks.
func (c *prefixCache) release(n int) { c.used -= n }

// insert names one reserved private block seq, pinned once, and returns it.
// The caller checks that seq is not cached yet.
func (c *prefixCache) insert(seq kvroute.SeqHash) *cacheBlock {
	var b *cacheBlock
	if k := len(c.free); k > 0 {
		b = c.free[k-1]
		c.free = c.free[:k-1]
		*b = cacheBlock{}
	} else {
		b = new(cacheBlock)
	}
	b.seq, b.refs = seq, 1
	c.blocks[seq] = b
	return b
}

// lookup returns the named block, or nil.
func (c *prefixCache) lookup(seq kvroute.SeqHash) *cacheBlock { return c.blocks[seq] }

// pinned returns the blocks in use by running requests.
func (c *prefixCache) pinned() int { return c.used - c.evictable }
