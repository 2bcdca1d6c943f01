package tokenizer

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a piece of text before pre-tokenization, as the
// normalizers of Hugging Face tokenizers do.
type normalizer interface {
	normalize(s string) string
	// normalizeLead is normalize that also follows where the text starts:
	// lead is the number of leading bytes of s that Hugging Face's
	// alignments map to the start of the original text (0 when s does not
	// begin there), and the result's lead is returned with it. Metaspace's
	// "first" prepend scheme reads it.
	normalizeLead(s string, lead int) (string, int)
}

// firstRuneLen is the lead of a text that begins the original text: the
// bytes of its first character.
func firstRuneLen(s string) int {
	_, n := utf8.DecodeRuneInString(s)
	return n
}

type unicodeNorm struct{ form norm.Form }

func (n unicodeNorm) normalize(s string) string {
	if n.form.IsNormalString(s) {
		return s
	}
	out := n.form.String(s)
	if n.streamSafe(s, out) || hasUnknownToRef(s) {
		var b strings.Builder
		b.Grow(len(s))
		for _, sg := range n.segments(s) {
			b.Write(sg.out)
		}
		return b.String()
	}
	return out
}

// cgj is U+034F COMBINING GRAPHEME JOINER.
const cgj = "\u034f"

// streamSafe reports whether out, the x/text normalization of s, has
// U+034F inserted: x/text follows the Stream-Safe Text Format (UAX #15),
// breaking runs of more than 30 non-starters with it, where Hugging Face
// tokenizers (Rust's unicode-normalization) orders and composes runs of
// any length.
func (n unicodeNorm) streamSafe(s, out string) bool {
	return strings.Contains(out, cgj) && strings.Count(out, cgj) != strings.Count(s, cgj)
}

// normSegment is a part of a text that normalizes on its own: in is
// s[start:end], out its normalization.
type normSegment struct {
	start, end int
	out        []byte
}

// segments normalizes s as Hugging Face does where x/text differs: runs of
// non-starters of any length (no Stream-Safe limit) and the characters of
// unknownToReference left as they are, as starters. It works a segment at
// a time: each runs from a character that never combines with what
// precedes it to the next one; its characters are decomposed, its marks
// put in canonical order (stable by combining class) and, for NFC and
// NFKC, composed by the canonical composition algorithm.
func (n unicodeNorm) segments(s string) []normSegment {
	compose := n.form == norm.NFC || n.form == norm.NFKC
	var segs []normSegment
	var runes []rune
	flush := func(start, end int) {
		if start == end {
			return
		}
		runes = runes[:0]
		for _, r := range s[start:end] {
			for _, d := range n.decompose(r) {
				runes = append(runes, d)
			}
		}
		canonicalOrder(runes)
		if compose {
			runes = canonicalCompose(runes)
		}
		out := make([]byte, 0, end-start)
		for _, r := range runes {
			out = utf8.AppendRune(out, r)
		}
		segs = append(segs, normSegment{start, end, out})
	}
	start := 0
	for i, r := range s {
		if i > start && n.splitsAt(s, i, r) {
			flush(start, i)
			start = i
		}
	}
	flush(start, len(s))
	return segs
}

// splitsAt reports whether a segment of s starts at i, where r begins: at
// a character that never combines with what precedes it, or one of
// unknownToReference.
func (n unicodeNorm) splitsAt(s string, i int, r rune) bool {
	return unknownToRef(r) || n.form.PropertiesString(s[i:i+utf8.RuneLen(r)]).BoundaryBefore()
}

// decompose returns the decomposition of r (canonical for NFC and NFD,
// compatibility for NFKC and NFKD) as Hugging Face's tables give it.
func (n unicodeNorm) decompose(r rune) string {
	if unknownToRef(r) {
		return string(r)
	}
	if n.form == norm.NFKC || n.form == norm.NFKD {
		return norm.NFKD.String(string(r))
	}
	return norm.NFD.String(string(r))
}

// combiningClass returns the canonical combining class of r as Hugging
// Face's tables give it.
func combiningClass(r rune) uint8 {
	if unknownToRef(r) {
		return 0
	}
	var b [utf8.UTFMax]byte
	return norm.NFD.Properties(b[:utf8.EncodeRune(b[:], r)]).CCC()
}

// canonicalOrder sorts each run of non-starters by combining class,
// keeping the order of equal classes.
func canonicalOrder(rs []rune) {
	for i := 0; i < len(rs); {
		if combiningClass(rs[i]) == 0 {
			i++
			continue
		}
		j := i
		for j < len(rs) && combiningClass(rs[j]) != 0 {
			j++
		}
		slices.SortStableFunc(rs[i:j], func(a, b rune) int { return int(combiningClass(a)) - int(combiningClass(b)) })
		i = j
	}
}

// canonicalCompose composes decomposed, canonically ordered runes (UAX #15
// canonical composition): each character joins the last starter when no
// character between them is a starter or has its combining class or
// higher, and the two have a primary composite.
func canonicalCompose(rs []rune) []rune {
	out := rs[:0]
	starter := -1
	last := uint8(0) // class of the last character kept after the starter
	for _, r := range rs {
		c := combiningClass(r)
		if starter >= 0 && (last == 0 || last < c) {
			if p, ok := composePair(out[starter], r); ok {
				out[starter] = p
				continue
			}
		}
		if c == 0 {
			starter = len(out)
		}
		last = c
		out = append(out, r)
	}
	return out
}

// composePair returns the primary composite of a and b, if there is one.
func composePair(a, b rune) (rune, bool) {
	if unknownToRef(a) || unknownToRef(b) {
		return 0, false
	}
	s := norm.NFC.String(string([]rune{a, b}))
	r, size := utf8.DecodeRuneInString(s)
	return r, size == len(s) && r != utf8.RuneError
}

// normalizeLead normalizes s a segment at a time. Hugging Face aligns
// what a character becomes (its decomposition, or the character it
// composes into with the marks that follow) with that character, so the
// segments coming from characters that begin in the lead make the new
// lead.
//
// It reads the segments that begin in the lead one at a time, never with
// x/text's norm.Iter: the iterator dereferences a nil flusher on some
// inputs (NFD of "a\uff9e\u0308\uff9e" in x/text v0.43.0), where
// Form.String, which the segments use for single characters and pairs,
// does not. The text from the first segment past the lead on normalizes
// on its own, as normalize does.
func (n unicodeNorm) normalizeLead(s string, lead int) (string, int) {
	if lead == 0 || n.form.IsNormalString(s) {
		return n.normalize(s), lead
	}
	cut := len(s)
	for i, r := range s {
		if i >= lead && n.splitsAt(s, i, r) {
			cut = i
			break
		}
	}
	var b strings.Builder
	b.Grow(len(s))
	out := 0
	for _, sg := range n.segments(s[:cut]) {
		if out == b.Len() {
			out += n.leadBytes(s[sg.start:sg.end], lead-sg.start, sg.out)
		}
		b.Write(sg.out)
	}
	b.WriteString(n.normalize(s[cut:]))
	return b.String(), out
}

// leadBytes is the length of the leading part of seg, the normalization
// of in, made of characters coming from characters of in that begin
// before its byte lead: each character of seg is matched with the
// decompositions of the characters of in, in order (a composed character
// comes from the first of the characters it composes).
func (n unicodeNorm) leadBytes(in string, lead int, seg []byte) int {
	var from []int // for each rune of in's decomposition: where its character begins in in
	for i, r := range in {
		for range utf8.RuneCountInString(n.decompose(r)) {
			from = append(from, i)
		}
	}
	k, j := 0, 0
	for j < len(seg) && k < len(from) && from[k] < lead {
		r, size := utf8.DecodeRune(seg[j:])
		k += utf8.RuneCountInString(n.decompose(r))
		j += size
	}
	return j
}

// prepend adds its text to a non-empty piece.
type prepend struct{ text string }

func (n prepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.text + s
}

// normalizeLead: the prepended text is aligned with the first character.
func (n prepend) normalizeLead(s string, lead int) (string, int) {
	if s == "" || lead < firstRuneLen(s) {
		return n.normalize(s), 0
	}
	return n.text + s, len(n.text) + lead
}

// replace replaces every occurrence of a literal.
type replace struct{ old, new string }

func (n replace) normalize(s string) string {
	if n.old == "" {
		return s
	}
	return strings.ReplaceAll(s, n.old, n.new)
}

// normalizeLead: the replacement of a match is aligned with the match's
// last byte (Hugging Face's NormalizedString.replace), the rest with
// themselves; the result's lead ends at its first byte aligned past the
// original start.
func (n replace) normalizeLead(s string, lead int) (string, int) {
	out := n.normalize(s)
	if n.old == "" || lead == 0 {
		return out, 0
	}
	newLead, i := 0, 0
	for i < len(s) {
		k := strings.Index(s[i:], n.old)
		if k < 0 {
			k = len(s) - i
		}
		// Unmatched bytes s[i:i+k] keep their alignment.
		if i+k > lead {
			return out, newLead + max(lead-i, 0)
		}
		newLead += k
		i += k
		if i == len(s) {
			break
		}
		if i+len(n.old)-1 >= lead { // the match's last byte is past the lead
			return out, newLead
		}
		newLead += len(n.new)
		i += len(n.old)
	}
	return out, newLead
}

// strip removes Unicode white space on either side.
type strip struct{ left, right bool }

func (n strip) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

// normalizeLead: stripped white space takes its share of the lead with it.
func (n strip) normalizeLead(s string, lead int) (string, int) {
	out := s
	if n.left {
		out = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	lead = max(lead-(len(s)-len(out)), 0)
	if n.right {
		out = strings.TrimRightFunc(out, unicode.IsSpace)
	}
	return out, min(lead, len(out))
}

type normalizerSeq []normalizer

func (q normalizerSeq) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

func (q normalizerSeq) normalizeLead(s string, lead int) (string, int) {
	for _, n := range q {
		s, lead = n.normalizeLead(s, lead)
	}
	return s, lead
}

// parseNormalizer reads a "normalizer" object; nil means none.
func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := componentType("normalizer", raw)
	if err != nil {
		return nil, err
	}
	what := "normalizer " + typ
	switch typ {
	case "NFC", "NFD", "NFKC", "NFKD":
		var v struct {
			Type string `json:"type"`
		}
		if err := strict(what, raw, &v); err != nil {
			return nil, err
		}
		return unicodeNorm{map[string]norm.Form{"NFC": norm.NFC, "NFD": norm.NFD, "NFKC": norm.NFKC, "NFKD": norm.NFKD}[typ]}, nil
	case "Prepend":
		var v struct {
			Type    string `json:"type"`
			Prepend string `json:"prepend"`
		}
		if err := strict(what, raw, &v); err != nil {
			return nil, err
		}
		return prepend{v.Prepend}, nil
	case "Replace":
		old, nw, err := literalReplace(what, raw)
		if err != nil {
			return nil, err
		}
		return replace{old, nw}, nil
	case "Strip":
		var v struct {
			Type  string `json:"type"`
			Left  bool   `json:"strip_left"`
			Right bool   `json:"strip_right"`
		}
		if err := strict(what, raw, &v); err != nil {
			return nil, err
		}
		return strip{v.Left, v.Right}, nil
	case "Sequence":
		items, err := sequence(what, raw, "normalizers", parseNormalizer)
		if err != nil {
			return nil, err
		}
		var seq normalizerSeq
		for _, n := range items {
			if n != nil {
				seq = append(seq, n)
			}
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return seq, nil
	}
	return nil, fmt.Errorf("%w: normalizer %q", ErrUnsupported, typ)
}
