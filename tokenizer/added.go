package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's "added_tokens": text matched
// in the input before any other processing and given its own id.
type addedToken struct {
	content        string
	id             uint32
	lstrip, rstrip bool
	special        bool
}

// matchSet finds added tokens in text, leftmost first and longest among
// those starting at the same place, as Hugging Face tokenizers' added
// vocabulary does. The tokens are kept in a byte trie, so that finding the
// tokens at a position takes the length of the longest one there whatever
// the number of tokens sharing a prefix (Llama 3's 256 "<|reserved_...|>").
type matchSet struct {
	root   [256]int32 // the node after each first byte, 0 for none
	nodes  []addedNode
	tokens []*addedToken
}

// addedNode is a node of the trie after the root.
type addedNode struct {
	next []addedEdge // few: scanned in order
	tok  int32       // index in tokens of the token ending here, -1 for none
}

type addedEdge struct {
	b    byte
	node int32
}

// child returns the node after n on byte b, or 0.
func (m *matchSet) child(n int32, b byte) int32 {
	for _, e := range m.nodes[n].next {
		if e.b == b {
			return e.node
		}
	}
	return 0
}

func newMatchSet(tokens []*addedToken) *matchSet {
	if len(tokens) == 0 {
		return nil
	}
	m := &matchSet{nodes: []addedNode{{tok: -1}}} // node 0 stands for "none"
	for _, t := range tokens {
		if t.content == "" {
			continue
		}
		n := m.root[t.content[0]]
		if n == 0 {
			n = m.newNode()
			m.root[t.content[0]] = n
		}
		for i := 1; i < len(t.content); i++ {
			c := m.child(n, t.content[i])
			if c == 0 {
				c = m.newNode()
				m.nodes[n].next = append(m.nodes[n].next, addedEdge{t.content[i], c})
			}
			n = c
		}
		if m.nodes[n].tok < 0 { // the first of equal contents wins
			m.nodes[n].tok = int32(len(m.tokens))
			m.tokens = append(m.tokens, t)
		}
	}
	return m
}

func (m *matchSet) newNode() int32 {
	m.nodes = append(m.nodes, addedNode{tok: -1})
	return int32(len(m.nodes) - 1)
}

// segment is a part of the input: an added token (tok != nil) or text.
type segment struct {
	text string
	tok  *addedToken
	lead int // as piece.lead
}

// split appends the segments of s to dst; lead is that of s (see
// piece.lead). Text segments are never empty.
func (m *matchSet) split(dst []segment, s string, lead int) []segment {
	if m == nil {
		if s != "" {
			dst = append(dst, segment{text: s, lead: lead})
		}
		return dst
	}
	from := func(i int) int { return max(lead-i, 0) }
	// As in Hugging Face tokenizers, the tokens are found in the text
	// alone, leftmost and longest first, and their lstrip and rstrip then
	// widen them: rstrip may take white space in which the next token
	// begins (both are kept, the text between them read again), lstrip
	// stops at the end of the previous token, and a token left empty by
	// the two is dropped.
	done := 0 // end of the last emitted segment
	for i := 0; i < len(s); {
		t := m.at(s, i)
		if t == nil {
			i++
			continue
		}
		start, stop := i, i+len(t.content)
		i = stop
		if t.lstrip {
			start = max(len(strings.TrimRightFunc(s[:start], unicode.IsSpace)), done)
		}
		if t.rstrip {
			stop = len(s) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
		}
		if done < start {
			dst = append(dst, segment{text: s[done:start], lead: from(done)})
		}
		// start reaches stop only when the previous token's rstrip took
		// this whole token and its lstrip is set: tokenizers then drops it
		// as an empty piece (or fails, when start passes stop).
		if start < stop {
			dst = append(dst, segment{text: s[start:stop], tok: t, lead: from(start)})
		}
		done = stop
	}
	if done < len(s) {
		dst = append(dst, segment{text: s[done:], lead: from(done)})
	}
	return dst
}

// at returns the longest token starting at s[i], or nil.
func (m *matchSet) at(s string, i int) *addedToken {
	n := m.root[s[i]]
	if n == 0 {
		return nil
	}
	var best *addedToken
	for j := i + 1; ; j++ {
		if k := m.nodes[n].tok; k >= 0 {
			best = m.tokens[k]
		}
		if j == len(s) {
			return best
		}
		if n = m.child(n, s[j]); n == 0 {
			return best
		}
	}
}

// validUTF8 replaces each ill-formed sequence of s with U+FFFD: each
// maximal subpart (the longest start of a well-formed sequence, or else
// one byte), as Python's bytes.decode(errors="replace") and Rust's
// String::from_utf8_lossy do. A truncated three-byte character thus
// reads as one U+FFFD, a stray continuation byte as one each.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteString("\uFFFD")
			n = maximalSubpart(s[i:])
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// maximalSubpart returns the length of the maximal subpart of the
// ill-formed sequence at the start of s (Unicode 3.9, table 3-7): its lead
// byte and the continuation bytes that follow it as a well-formed sequence
// would, at least 1.
func maximalSubpart(s string) int {
	lo, hi, need := byte(0x80), byte(0xBF), 0 // range of the second byte, bytes after the lead
	switch c := s[0]; {
	case 0xC2 <= c && c <= 0xDF:
		need = 1
	case c == 0xE0:
		lo, need = 0xA0, 2
	case c == 0xED:
		hi, need = 0x9F, 2
	case 0xE1 <= c && c <= 0xEF:
		need = 2
	case c == 0xF0:
		lo, need = 0x90, 3
	case c == 0xF4:
		hi, need = 0x8F, 3
	case 0xF1 <= c && c <= 0xF3:
		need = 3
	}
	n := 1
	for ; n <= need && n < len(s); n++ {
		if c := s[n]; c < lo || c > hi {
			break
		}
		lo, hi = 0x80, 0xBF
	}
	return n
}
