package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// piece is a part of the text on its way to the model. lead is the number
// of its leading bytes that Hugging Face's alignments map to the start of
// the original text, 0 when it does not begin there (Metaspace's "first"
// prepend scheme reads it).
type piece struct {
	s    string
	lead int
}

// leadFrom is the lead of a part of p starting at byte i.
func (p piece) leadFrom(i int) int { return max(p.lead-i, 0) }

// preTokenizer splits pieces further, appending the results to dst.
type preTokenizer interface {
	split(dst []piece, p piece) []piece
}

// regexSplit is a Split pre-tokenizer with a known regular expression and
// the Isolated behaviour (every match becomes a piece).
type regexSplit struct{ match matcher }

func (t regexSplit) split(dst []piece, p piece) []piece {
	for i := 0; i < len(p.s); {
		e := t.match(p.s, i)
		dst = append(dst, piece{p.s[i:e], p.leadFrom(i)})
		i = e
	}
	return dst
}

// literalSplit is a Split pre-tokenizer with a literal pattern.
type literalSplit struct {
	lit    string
	remove bool // Removed behaviour; Isolated otherwise
}

func (t literalSplit) split(dst []piece, p piece) []piece {
	s, off := p.s, 0
	for {
		k := strings.Index(s[off:], t.lit)
		if k < 0 {
			break
		}
		if k > 0 {
			dst = append(dst, piece{s[off : off+k], p.leadFrom(off)})
		}
		if !t.remove {
			dst = append(dst, piece{t.lit, p.leadFrom(off + k)})
		}
		off += k + len(t.lit)
	}
	if off < len(s) {
		dst = append(dst, piece{s[off:], p.leadFrom(off)})
	}
	return dst
}

// byteLevel is the ByteLevel pre-tokenizer's splitting part; mapping
// bytes to the byte-level alphabet is left to the model (Tokenizer.byteLevel).
type byteLevel struct {
	addPrefixSpace bool
	useRegex       bool
}

func (t byteLevel) split(dst []piece, p piece) []piece {
	if t.addPrefixSpace && !strings.HasPrefix(p.s, " ") {
		p.s, p.lead = " "+p.s, prependLead(p, 1)
	}
	if !t.useRegex {
		return append(dst, p)
	}
	return regexSplit{matchGPT2}.split(dst, p)
}

// metaspace replaces spaces by a visible character, optionally prepends
// it, and optionally splits before each occurrence.
type metaspace struct {
	replacement string
	scheme      string // "always", "first" or "never"
	splitOn     bool
}

// prependLead is the lead of p once n bytes are prepended to it, which
// Hugging Face aligns with its first character.
func prependLead(p piece, n int) int {
	_, first := utf8.DecodeRuneInString(p.s)
	if p.lead < first {
		return 0
	}
	return p.lead + n
}

func (t metaspace) split(dst []piece, p piece) []piece {
	s := strings.ReplaceAll(p.s, " ", t.replacement)
	// Each replacement is aligned with the space it replaces.
	lead := p.lead + (len(t.replacement)-1)*strings.Count(p.s[:min(p.lead, len(p.s))], " ")
	if !strings.HasPrefix(s, t.replacement) && (t.scheme == "always" || t.scheme == "first" && p.lead > 0) {
		lead = prependLead(piece{s, lead}, len(t.replacement))
		s = t.replacement + s
	}
	q := piece{s, lead}
	if !t.splitOn {
		return append(dst, q)
	}
	start := 0
	for start < len(s) {
		k := strings.Index(s[start+1:], t.replacement)
		if k < 0 {
			break
		}
		end := start + 1 + k
		dst = append(dst, piece{s[start:end], q.leadFrom(start)})
		start = end
	}
	if start < len(s) {
		dst = append(dst, piece{s[start:], q.leadFrom(start)})
	}
	return dst
}

type preTokenizerSeq []preTokenizer

func (q preTokenizerSeq) split(dst []piece, p piece) []piece {
	cur := []piece{p}
	for _, t := range q {
		var next []piece
		for _, c := range cur {
			if c.s != "" {
				next = t.split(next, c)
			}
		}
		cur = next
	}
	return append(dst, cur...)
}

// parsePreTokenizer reads a "pre_tokenizer" object. It reports whether
// the pipeline ends with ByteLevel (pieces are then byte-mapped before the
// model).
func parsePreTokenizer(raw json.RawMessage) (preTokenizer, bool, error) {
	if isNull(raw) {
		return nil, false, nil
	}
	typ, err := componentType("pre_tokenizer", raw)
	if err != nil {
		return nil, false, err
	}
	what := "pre_tokenizer " + typ
	switch typ {
	case "ByteLevel":
		var v byteLevelSpec
		if err := strict(what, raw, &v); err != nil {
			return nil, false, err
		}
		return byteLevel{v.AddPrefixSpace, v.UseRegex == nil || *v.UseRegex}, true, nil
	case "Split":
		var v struct {
			Type     string  `json:"type"`
			Pattern  pattern `json:"pattern"`
			Behavior string  `json:"behavior"`
			Invert   bool    `json:"invert"`
		}
		if err := strict(what, raw, &v); err != nil {
			return nil, false, err
		}
		if v.Invert {
			return nil, false, fmt.Errorf("%w: %s with invert", ErrUnsupported, what)
		}
		switch {
		case v.Pattern.Regex != nil:
			m, ok := knownPatterns[*v.Pattern.Regex]
			if !ok {
				return nil, false, fmt.Errorf("%w: %s with the regular expression %q (known: GPT-2, Llama 3, Qwen 2)", ErrUnsupported, what, *v.Pattern.Regex)
			}
			if v.Behavior != "Isolated" {
				return nil, false, fmt.Errorf("%w: %s with a regular expression and behavior %q", ErrUnsupported, what, v.Behavior)
			}
			return regexSplit{m}, false, nil
		case v.Pattern.String != nil && *v.Pattern.String != "":
			if v.Behavior != "Isolated" && v.Behavior != "Removed" {
				return nil, false, fmt.Errorf("%w: %s with behavior %q", ErrUnsupported, what, v.Behavior)
			}
			return literalSplit{*v.Pattern.String, v.Behavior == "Removed"}, false, nil
		}
		return nil, false, fmt.Errorf("%w: %s without a pattern", ErrInvalid, what)
	case "Metaspace":
		var v struct {
			Type           string  `json:"type"`
			Replacement    string  `json:"replacement"`
			PrependScheme  *string `json:"prepend_scheme"`
			Split          *bool   `json:"split"`
			AddPrefixSpace *bool   `json:"add_prefix_space"` // before tokenizers 0.14
			StrRep         *string `json:"str_rep"`          // before tokenizers 0.14
		}
		if err := strict(what, raw, &v); err != nil {
			return nil, false, err
		}
		if len([]rune(v.Replacement)) != 1 {
			return nil, false, fmt.Errorf("%w: %s replacement %q is not one character", ErrInvalid, what, v.Replacement)
		}
		m := metaspace{replacement: v.Replacement, scheme: "always", splitOn: v.Split == nil || *v.Split}
		switch {
		case v.PrependScheme != nil:
			m.scheme = *v.PrependScheme
		case v.AddPrefixSpace != nil && !*v.AddPrefixSpace:
			m.scheme = "never"
		}
		if m.scheme != "always" && m.scheme != "first" && m.scheme != "never" {
			return nil, false, fmt.Errorf("%w: %s prepend_scheme %q", ErrInvalid, what, m.scheme)
		}
		return m, false, nil
	case "Sequence":
		var v struct {
			Type          string            `json:"type"`
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := strict(what, raw, &v); err != nil {
			return nil, false, err
		}
		var seq preTokenizerSeq
		bl := false
		for k, r := range v.PreTokenizers {
			t, b, err := parsePreTokenizer(r)
			if err != nil {
				return nil, false, err
			}
			if b && k != len(v.PreTokenizers)-1 {
				return nil, false, fmt.Errorf("%w: ByteLevel before another pre-tokenizer", ErrUnsupported)
			}
			if bt, ok := t.(byteLevel); ok && !bt.addPrefixSpace && !bt.useRegex {
				t = nil // splits nothing; the model maps the bytes
			}
			if t != nil {
				seq = append(seq, t)
			}
			bl = bl || b
		}
		switch len(seq) {
		case 0:
			return nil, bl, nil
		case 1:
			return seq[0], bl, nil
		}
		return seq, bl, nil
	}
	return nil, false, fmt.Errorf("%w: pre_tokenizer %q", ErrUnsupported, typ)
}
