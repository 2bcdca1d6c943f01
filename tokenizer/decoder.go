package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// decoder rewrites the tokens of a decoding, as the decoders of Hugging
// Face tokenizers' decode_chain do.
type decoder interface {
	decode(tokens []string) []string
}

// byteLevelDecoder maps the byte-level alphabet back to bytes.
type byteLevelDecoder struct{}

func (byteLevelDecoder) decode(tokens []string) []string {
	var b []byte
	for _, t := range tokens {
		for _, r := range t {
			if c, ok := charBytes[r]; ok {
				b = append(b, c)
			} else {
				b = utf8.AppendRune(b, r)
			}
		}
	}
	return []string{validUTF8(string(b))}
}

// metaspaceDecoder turns the replacement character back into spaces and
// drops the one prepended to the first token.
type metaspaceDecoder struct {
	replacement string
	prepended   bool // prepend_scheme is not "never"
}

func (d metaspaceDecoder) decode(tokens []string) []string {
	for i, t := range tokens {
		t = strings.ReplaceAll(t, d.replacement, " ")
		if i == 0 && d.prepended {
			t = strings.TrimPrefix(t, " ")
		}
		tokens[i] = t
	}
	return tokens
}

type replaceDecoder struct{ old, new string }

func (d replaceDecoder) decode(tokens []string) []string {
	for i, t := range tokens {
		tokens[i] = strings.ReplaceAll(t, d.old, d.new)
	}
	return tokens
}

// byteFallbackDecoder turns runs of <0xXX> tokens into their text, or one
// U+FFFD per byte when the run is not valid UTF-8.
type byteFallbackDecoder struct{}

func (byteFallbackDecoder) decode(tokens []string) []string {
	var out []string
	var run []byte
	flush := func() {
		if len(run) == 0 {
			return
		}
		if utf8.Valid(run) {
			out = append(out, string(run))
		} else {
			for range run {
				out = append(out, "\uFFFD")
			}
		}
		run = run[:0]
	}
	for _, t := range tokens {
		if len(t) == 6 && strings.HasPrefix(t, "<0x") && t[5] == '>' {
			var b byte
			if _, err := fmt.Sscanf(t[3:5], "%02X", &b); err == nil {
				run = append(run, b)
				continue
			}
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

type fuseDecoder struct{}

func (fuseDecoder) decode(tokens []string) []string { return []string{strings.Join(tokens, "")} }

// stripDecoder removes up to start (stop) occurrences of a character from
// the left (right) of each token.
type stripDecoder struct {
	content     string
	start, stop int
}

func (d stripDecoder) decode(tokens []string) []string {
	for i, t := range tokens {
		for k := 0; k < d.start && strings.HasPrefix(t, d.content); k++ {
			t = t[len(d.content):]
		}
		for k := 0; k < d.stop && strings.HasSuffix(t, d.content); k++ {
			t = t[:len(t)-len(d.content)]
		}
		tokens[i] = t
	}
	return tokens
}

// parseDecoder reads a "decoder" object as a chain; nil means tokens are
// joined as they are.
func parseDecoder(raw json.RawMessage) ([]decoder, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := componentType("decoder", raw)
	if err != nil {
		return nil, err
	}
	what := "decoder " + typ
	switch typ {
	case "ByteLevel":
		var v byteLevelSpec
		return []decoder{byteLevelDecoder{}}, strict(what, raw, &v)
	case "Metaspace":
		var v struct {
			Type           string  `json:"type"`
			Replacement    string  `json:"replacement"`
			PrependScheme  *string `json:"prepend_scheme"`
			Split          *bool   `json:"split"`
			AddPrefixSpace *bool   `json:"add_prefix_space"`
			StrRep         *string `json:"str_rep"`
		}
		if err := strict(what, raw, &v); err != nil {
			return nil, err
		}
		prepended := (v.PrependScheme == nil || *v.PrependScheme != "never") && (v.AddPrefixSpace == nil || *v.AddPrefixSpace)
		return []decoder{metaspaceDecoder{v.Replacement, prepended}}, nil
	case "Replace":
		old, nw, err := literalReplace(what, raw)
		if err != nil {
			return nil, err
		}
		return []decoder{replaceDecoder{old, nw}}, nil
	case "ByteFallback":
		var v struct {
			Type string `json:"type"`
		}
		return []decoder{byteFallbackDecoder{}}, strict(what, raw, &v)
	case "Fuse":
		var v struct {
			Type string `json:"type"`
		}
		return []decoder{fuseDecoder{}}, strict(what, raw, &v)
	case "Strip":
		var v struct {
			Type    string `json:"type"`
			Content string `json:"content"`
			Start   int    `json:"start"`
			Stop    int    `json:"stop"`
		}
		if err := strict(what, raw, &v); err != nil {
			return nil, err
		}
		if v.Content == "" || v.Start < 0 || v.Stop < 0 {
			return nil, fmt.Errorf("%w: %s with content %q, start %d, stop %d", ErrInvalid, what, v.Content, v.Start, v.Stop)
		}
		return []decoder{stripDecoder{v.Content, v.Start, v.Stop}}, nil
	case "Sequence":
		items, err := sequence(what, raw, "decoders", parseDecoder)
		if err != nil {
			return nil, err
		}
		var out []decoder
		for _, d := range items {
			out = append(out, d...)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: decoder %q", ErrUnsupported, typ)
}

// Decode returns the text of ids, skipping special tokens when asked
// (tokenizers' decode skips them by default). Unknown ids are skipped.
// Bytes that do not form UTF-8 read as U+FFFD, one per maximal subpart
// (after the ByteLevel decoder) or one per byte (after ByteFallback), as
// in tokenizers.
func (t *Tokenizer) Decode(ids []uint32, skipSpecialTokens bool) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		s, ok := t.Token(id)
		// As in tokenizers, a token is skipped when its text is that of a
		// special added token: a special token matched on normalized text
		// that normalization changes is kept.
		if ok && !(skipSpecialTokens && t.skipText[s]) {
			tokens = append(tokens, s)
		}
	}
	for _, d := range t.decoder {
		tokens = d.decode(tokens)
	}
	return strings.Join(tokens, "")
}
