package tokenizer

import (
	"encoding/json"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"unicode/utf8"
)

// bpe is the BPE model of Hugging Face tokenizers: a word's characters
// (or, with byte fallback, its bytes as <0xXX> tokens) are merged pair by
// pair, always the pair of lowest merge rank first, the leftmost on ties.
type bpe struct {
	vocab        map[string]uint32
	merges       map[uint64]mergeRule // key: left id << 32 | right id
	unk          int64                // -1: no unknown token
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	byteTokens   [256]int64 // ids of <0x00>..<0xFF>, -1 when absent

	// byteLevel is set when pieces arrive as raw text that the ByteLevel
	// pre-tokenizer maps to its alphabet. rawVocab then holds the vocab
	// keyed by the bytes each token stands for, and byteIDs the id of each
	// byte's character, so that the fast path never builds mapped strings.
	byteLevel bool
	fastBytes bool // every byte's character is in the vocab
	byteIDs   [256]uint32
	rawVocab  map[string]uint32

	cache cache
}

type mergeRule struct{ rank, id uint32 }

// cache maps pieces to their ids. It fills up to its capacity and then
// stops growing, as the cache of Hugging Face tokenizers does. It is
// sharded so that concurrent encodings rarely share a lock.
type cache struct {
	seed   maphash.Seed
	once   sync.Once
	shards [cacheShards]cacheShard
}

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]uint32 // guarded by mu
}

const (
	cacheShards   = 16
	cacheCapacity = 1 << 14 // entries
	cacheMaxLen   = 256     // bytes; longer pieces are not cached
)

func (c *cache) shard(s string) *cacheShard {
	c.once.Do(func() { c.seed = maphash.MakeSeed() })
	return &c.shards[maphash.String(c.seed, s)%cacheShards]
}

func (c *cache) get(s string) ([]uint32, bool) {
	if len(s) >= cacheMaxLen {
		return nil, false
	}
	sh := c.shard(s)
	sh.mu.RLock()
	ids, ok := sh.m[s]
	sh.mu.RUnlock()
	return ids, ok
}

func (c *cache) put(s string, ids []uint32) {
	if len(s) >= cacheMaxLen {
		return
	}
	sh := c.shard(s)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m == nil {
		sh.m = make(map[string][]uint32)
	}
	if len(sh.m) < cacheCapacity/cacheShards {
		sh.m[strings.Clone(s)] = append([]uint32(nil), ids...)
	}
}

type bpeSpec struct {
	Type                    string          `json:"type"`
	Dropout                 *float64        `json:"dropout"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Vocab                   map[string]int  `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
}

func parseBPE(raw json.RawMessage, byteLevel bool) (*bpe, error) {
	var v bpeSpec
	if err := strict("model BPE", raw, &v); err != nil {
		return nil, err
	}
	if v.Dropout != nil && *v.Dropout != 0 {
		return nil, fmt.Errorf("%w: BPE dropout %v", ErrUnsupported, *v.Dropout)
	}
	if v.ContinuingSubwordPrefix != nil && *v.ContinuingSubwordPrefix != "" {
		return nil, fmt.Errorf("%w: BPE continuing_subword_prefix %q", ErrUnsupported, *v.ContinuingSubwordPrefix)
	}
	if v.EndOfWordSuffix != nil && *v.EndOfWordSuffix != "" {
		return nil, fmt.Errorf("%w: BPE end_of_word_suffix %q", ErrUnsupported, *v.EndOfWordSuffix)
	}
	m := &bpe{
		vocab:        make(map[string]uint32, len(v.Vocab)),
		unk:          -1,
		fuseUnk:      v.FuseUnk,
		byteFallback: v.ByteFallback,
		ignoreMerges: v.IgnoreMerges,
		byteLevel:    byteLevel,
	}
	for tok, id := range v.Vocab {
		if id < 0 || id > maxID {
			return nil, fmt.Errorf("%w: BPE token %q has id %d", ErrInvalid, tok, id)
		}
		m.vocab[tok] = uint32(id)
	}
	if v.UnkToken != nil {
		id, ok := m.vocab[*v.UnkToken]
		if !ok {
			return nil, fmt.Errorf("%w: BPE unk_token %q is not in the vocab", ErrInvalid, *v.UnkToken)
		}
		m.unk = int64(id)
	}
	for b := range 256 {
		m.byteTokens[b] = -1
		if id, ok := m.vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteTokens[b] = int64(id)
		}
	}
	pairs, err := parseMerges(v.Merges)
	if err != nil {
		return nil, err
	}
	m.merges = make(map[uint64]mergeRule, len(pairs))
	for rank, p := range pairs {
		a, okA := m.vocab[p[0]]
		b, okB := m.vocab[p[1]]
		c, okC := m.vocab[p[0]+p[1]]
		if !okA || !okB || !okC {
			return nil, fmt.Errorf("%w: BPE merge %q %q uses a token not in the vocab", ErrInvalid, p[0], p[1])
		}
		key := uint64(a)<<32 | uint64(b)
		if _, dup := m.merges[key]; !dup { // the first (lowest) rank wins
			m.merges[key] = mergeRule{uint32(rank), c}
		}
	}
	if byteLevel {
		m.fastBytes = true
		for b := range 256 {
			id, ok := m.vocab[byteChars[b]]
			if !ok {
				m.fastBytes = false
				break
			}
			m.byteIDs[b] = id
		}
		m.rawVocab = make(map[string]uint32, len(m.vocab))
		for tok, id := range m.vocab {
			if raw, ok := unmapBytes(tok); ok {
				m.rawVocab[raw] = id
			}
		}
	}
	return m, nil
}

// maxID bounds token ids so that they fit the uint32 ids kvroute uses.
const maxID = 1<<31 - 1

// parseMerges reads merges given as "a b" strings or as ["a", "b"] pairs.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("%w: BPE merges: %w", ErrInvalid, err)
	}
	out := make([][2]string, 0, len(items))
	for _, it := range items {
		var s string
		if json.Unmarshal(it, &s) == nil {
			a, b, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(b, " ") {
				return nil, fmt.Errorf("%w: BPE merge %q is not two tokens", ErrInvalid, s)
			}
			out = append(out, [2]string{a, b})
			continue
		}
		var p []string
		if err := json.Unmarshal(it, &p); err != nil || len(p) != 2 {
			return nil, fmt.Errorf("%w: BPE merge %s is not two tokens", ErrInvalid, it)
		}
		out = append(out, [2]string{p[0], p[1]})
	}
	return out, nil
}

// symbol is a node of the doubly linked list a word is merged in.
type symbol struct {
	id         uint32
	prev, next int32
	dead       bool
}

type mergeItem struct {
	rank uint32
	pos  int32
	id   uint32
}

// scratch holds the buffers of one word's merging, pooled.
type scratch struct {
	syms []symbol
	heap []mergeItem
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// tokenize appends the ids of one piece.
func (m *bpe) tokenize(dst []uint32, s string) []uint32 {
	if ids, ok := m.cache.get(s); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	dst = m.tokenizeUncached(dst, s)
	m.cache.put(s, dst[start:])
	return dst
}

func (m *bpe) tokenizeUncached(dst []uint32, s string) []uint32 {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	syms := sc.syms[:0]
	switch {
	case m.byteLevel && m.fastBytes:
		if m.ignoreMerges {
			if id, ok := m.rawVocab[s]; ok {
				return append(dst, id)
			}
		}
		for i := 0; i < len(s); i++ {
			syms = append(syms, symbol{id: m.byteIDs[s[i]]})
		}
	default:
		w := s
		if m.byteLevel {
			w = mapBytes(s)
		}
		if m.ignoreMerges {
			if id, ok := m.vocab[w]; ok {
				return append(dst, id)
			}
		}
		syms = m.initial(syms, w)
	}
	for i := range syms {
		syms[i].prev, syms[i].next = int32(i-1), int32(i+1)
	}
	if n := len(syms); n > 0 {
		syms[n-1].next = -1
	}
	sc.heap = m.mergeAll(syms, sc.heap[:0])
	for i := range syms {
		if !syms[i].dead {
			dst = append(dst, syms[i].id)
		}
	}
	sc.syms = syms
	return dst
}

// initial splits a word into its first symbols: characters in the vocab,
// else their bytes as <0xXX> tokens (byte fallback), else the unknown
// token (runs of them fused with fuseUnk), else nothing.
func (m *bpe) initial(syms []symbol, w string) []symbol {
	unk := false
	for i := 0; i < len(w); {
		_, n := utf8.DecodeRuneInString(w[i:])
		ch := w[i : i+n]
		i += n
		if id, ok := m.vocab[ch]; ok {
			if unk {
				syms = append(syms, symbol{id: uint32(m.unk)})
				unk = false
			}
			syms = append(syms, symbol{id: id})
			continue
		}
		if m.byteFallback {
			all := true
			for k := 0; k < len(ch); k++ {
				if m.byteTokens[ch[k]] < 0 {
					all = false
					break
				}
			}
			if all {
				// A pending unknown token stays pending, as in Hugging
				// Face tokenizers.
				for k := 0; k < len(ch); k++ {
					syms = append(syms, symbol{id: uint32(m.byteTokens[ch[k]])})
				}
				continue
			}
		}
		if m.unk >= 0 {
			if unk && !m.fuseUnk {
				syms = append(syms, symbol{id: uint32(m.unk)})
			}
			unk = true
		}
	}
	if unk {
		syms = append(syms, symbol{id: uint32(m.unk)})
	}
	return syms
}

// mergeAll applies merges lowest rank first, leftmost first on ties.
func (m *bpe) mergeAll(syms []symbol, h []mergeItem) []mergeItem {
	for i := 0; i+1 < len(syms); i++ {
		if r, ok := m.merges[uint64(syms[i].id)<<32|uint64(syms[i+1].id)]; ok {
			h = heapPush(h, mergeItem{r.rank, int32(i), r.id})
		}
	}
	for len(h) > 0 {
		var top mergeItem
		top, h = heapPop(h)
		cur := &syms[top.pos]
		if cur.dead || cur.next < 0 {
			continue
		}
		right := &syms[cur.next]
		if r, ok := m.merges[uint64(cur.id)<<32|uint64(right.id)]; !ok || r.id != top.id {
			continue // stale entry
		}
		cur.id = top.id
		right.dead = true
		cur.next = right.next
		if cur.next >= 0 {
			syms[cur.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if r, ok := m.merges[uint64(syms[cur.prev].id)<<32|uint64(cur.id)]; ok {
				h = heapPush(h, mergeItem{r.rank, cur.prev, r.id})
			}
		}
		if cur.next >= 0 {
			if r, ok := m.merges[uint64(cur.id)<<32|uint64(syms[cur.next].id)]; ok {
				h = heapPush(h, mergeItem{r.rank, top.pos, r.id})
			}
		}
	}
	return h
}

func less(a, b mergeItem) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

func heapPush(h []mergeItem, it mergeItem) []mergeItem {
	h = append(h, it)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !less(h[i], h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []mergeItem) (mergeItem, []mergeItem) {
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && less(h[l], h[m]) {
			m = l
		}
		if r < n && less(h[r], h[m]) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return top, h
}
