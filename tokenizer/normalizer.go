package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a piece of text before pre-tokenization, as the
// normalizers of Hugging Face tokenizers do.
type normalizer interface {
	normalize(s string) string
}

type unicodeNorm struct{ form norm.Form }

func (n unicodeNorm) normalize(s string) string {
	if n.form.IsNormalString(s) {
		return s
	}
	return n.form.String(s)
}

// prepend adds its text to a non-empty piece.
type prepend struct{ text string }

func (n prepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.text + s
}

// replace replaces every occurrence of a literal.
type replace struct{ old, new string }

func (n replace) normalize(s string) string {
	if n.old == "" {
		return s
	}
	return strings.ReplaceAll(s, n.old, n.new)
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

type normalizerSeq []normalizer

func (q normalizerSeq) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
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
