package tokenizer

import (
	"sort"
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
// vocabulary does.
type matchSet struct {
	byFirst [256][]*addedToken // by first byte, longest first
}

func newMatchSet(tokens []*addedToken) *matchSet {
	if len(tokens) == 0 {
		return nil
	}
	m := &matchSet{}
	for _, t := range tokens {
		if t.content == "" {
			continue
		}
		m.byFirst[t.content[0]] = append(m.byFirst[t.content[0]], t)
	}
	for _, l := range &m.byFirst {
		sort.SliceStable(l, func(i, j int) bool { return len(l[i].content) > len(l[j].content) })
	}
	return m
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

func (m *matchSet) at(s string, i int) *addedToken {
	for _, t := range m.byFirst[s[i]] {
		if strings.HasPrefix(s[i:], t.content) {
			return t
		}
	}
	return nil
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
