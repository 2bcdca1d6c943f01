package tokenizer_test

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvroute/kvroute/tokenizer"
)

// lossyUTF8 reads s as Python's bytes.decode(errors="replace") does, found
// by trying completions rather than by the tables of Unicode 3.9: an
// ill-formed sequence of k bytes is replaced by one U+FFFD when it can
// start a well-formed character, else its first byte alone is.
func lossyUTF8(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r != utf8.RuneError || n != 1 {
			b.WriteString(s[i : i+n])
			i += n
			continue
		}
		b.WriteRune(utf8.RuneError)
		n = 1
		for k := 3; k >= 2; k-- {
			if i+k > len(s) {
				continue
			}
			for fill := 1; k+fill <= 4; fill++ {
				if utf8.ValidString(s[i:i+k] + strings.Repeat("\x80", fill)) {
					n = max(n, k)
				}
			}
		}
		i += n
	}
	return b.String()
}

// TestInvalidUTF8 checks that ill-formed bytes encode as the text Python
// and Rust read them as: one U+FFFD per maximal subpart, so a character
// cut short is one U+FFFD and not one per byte.
func TestInvalidUTF8(t *testing.T) {
	texts := []string{
		"\xff", "\xfe\xff", "a\xe6\x97", "\xe6\x97\xa5\xe6\x97", "\xe6\x97a", "\xed\xa0\x80", "\xed\x9f", "\xc0\xaf", "\xc2",
		"\xe0\x80\x80", "\xe0\xa0", "\xf0\x9f\x98", "\xf0\x9f\x98a", "\xf0\x80\x80", "\xf4\x90\x80\x80", "\xf4\x8f\xbf", "ok\x80\x80ok",
		"\xf8\x88\x80\x80\x80", "<|x|>\xe6\x97<|x|>", strings.Repeat("\xf0\x9f", 50),
	}
	for _, fam := range []string{"llama3", "mistral", "unigram"} {
		tok, err := tokenizer.FromFile(filepath.Join("testdata", fam, "tokenizer.json"))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range texts {
			want := lossyUTF8(s)
			if got, w := tok.Encode(nil, s, true), tok.Encode(nil, want, true); !slices.Equal(got, w) {
				t.Errorf("%s: Encode(%q) = %v, want that of %q: %v", fam, s, got, want, w)
			}
		}
	}
}

// TestAddedTokenIDs checks that added tokens take the ids tokenizers gives
// them at load, not those the file writes: a token of the model's vocab
// keeps its vocab id, any other takes the next id after the vocab and the
// added tokens listed before it.
func TestAddedTokenIDs(t *testing.T) {
	entry := func(id int, content string) map[string]any {
		return map[string]any{"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
	}
	var size, x int
	tok, err := tokenizer.Parse(tiny(func(m map[string]any) {
		vocab := model(m)["vocab"].(map[string]any)
		size, x = len(vocab), vocab["<|x|>"].(int)
		m["added_tokens"] = append(m["added_tokens"].([]any),
			entry(7000, "ab"), entry(5000, "<|y|>"), entry(2, "<|z|>"), entry(9, "<|x|>"), entry(5000, "<|y|>"), entry(1, ""))
	}))
	if err != nil {
		t.Fatal(err)
	}
	ab, _ := tok.TokenID("ab")
	for _, tt := range []struct {
		text string
		want uint32
	}{
		{"ab", ab},
		{"<|x|>", uint32(x)},
		{"<|y|>", uint32(size)},
		{"<|z|>", uint32(size + 1)},
	} {
		if got := tok.Encode(nil, tt.text, false); !slices.Equal(got, []uint32{tt.want}) {
			t.Errorf("Encode(%q) = %v, want [%d]", tt.text, got, tt.want)
		}
		if id, ok := tok.TokenID(tt.text); !ok || id != tt.want {
			t.Errorf("TokenID(%q) = %d, %v, want %d", tt.text, id, ok, tt.want)
		}
	}
	if ab >= uint32(size) {
		t.Errorf("TokenID(ab) = %d, want its vocab id", ab)
	}
	if !tok.IsSpecial(ab) || tok.Decode([]uint32{ab, uint32(size)}, true) != "" {
		t.Errorf("the added tokens at vocab ids are not special")
	}
	_, err = tokenizer.Parse(tiny(func(m map[string]any) {
		m["normalizer"] = map[string]any{"type": "Strip", "strip_left": true, "strip_right": true}
		e := entry(99, " ")
		e["normalized"] = true
		m["added_tokens"] = append(m["added_tokens"].([]any), e)
	}))
	if !errors.Is(err, tokenizer.ErrUnsupported) {
		t.Errorf("a token normalized to nothing: %v, want ErrUnsupported", err)
	}
	_, err = tokenizer.Parse(tiny(func(m map[string]any) {
		e := entry(99, "<|x|>")
		e["lstrip"] = true
		m["added_tokens"] = append(m["added_tokens"].([]any), e)
	}))
	if !errors.Is(err, tokenizer.ErrUnsupported) {
		t.Errorf("a token listed twice with different options: %v, want ErrUnsupported", err)
	}
}

// TestAddedTokenStripOverlap checks rstrip and lstrip as tokenizers
// applies them: tokens are found in the text first, so a token's rstrip
// may take the white space another token begins with (both are kept, and
// the text after the first token is read from its end), and lstrip stops
// at the previous token.
func TestAddedTokenStripOverlap(t *testing.T) {
	entry := func(id int, content string, lstrip, rstrip bool) map[string]any {
		return map[string]any{"id": id, "content": content, "single_word": false, "lstrip": lstrip, "rstrip": rstrip, "normalized": false, "special": true}
	}
	tok, err := tokenizer.Parse(tiny(func(m map[string]any) {
		n := len(model(m)["vocab"].(map[string]any))
		m["added_tokens"] = append(m["added_tokens"].([]any),
			entry(n, "<|r|>", false, true), entry(n+1, " sp ", false, false), entry(n+2, "\n", false, false), entry(n+3, "<|l|>", true, false),
			entry(n+4, "\t", true, true))
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := tokenIDs(t, tok)
	x, space := tok.Encode(nil, "x", false), tok.Encode(nil, " ", false)
	for _, tt := range []struct {
		text string
		want []uint32
	}{
		{"<|r|> sp x", append([]uint32{id("<|r|>"), id(" sp ")}, x...)},
		{"<|r|>\n\nx", append([]uint32{id("<|r|>"), id("\n"), id("\n")}, x...)},
		{"<|r|>\n \n", slices.Concat([]uint32{id("<|r|>"), id("\n")}, space, []uint32{id("\n")})},
		{"<|r|>  <|l|>x", append([]uint32{id("<|r|>"), id("<|l|>")}, x...)},
		{"x  <|l|>", append(x, id("<|l|>"))},
		{"\t\t\tx", append([]uint32{id("\t")}, x...)}, // tokenizers fails on it: an empty token is dropped
		{"<|r|>\t\t", []uint32{id("<|r|>")}},
	} {
		if got := tok.Encode(nil, tt.text, false); !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

// TestDecodeAsTokenizers checks two corners of decoding: the ByteLevel
// decoder reads ill-formed bytes as one U+FFFD per maximal subpart, and
// skipping special tokens skips by text, so a special token matched on
// normalized text that normalization changes is kept (under its
// normalized text), as tokenizers' decode does.
func TestDecodeAsTokenizers(t *testing.T) {
	llama, err := tokenizer.FromFile(filepath.Join("testdata", "llama3", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	c3, ok1 := llama.TokenID("Ã") // the byte 0xC3, which starts a two-byte character
	a, ok2 := llama.TokenID("a")
	if !ok1 || !ok2 {
		t.Fatal("no byte tokens")
	}
	if got := llama.Decode([]uint32{c3, c3, a}, true); got != "\uFFFD\uFFFDa" {
		t.Errorf("Decode(0xC3 0xC3 a) = %+q, want two U+FFFD and a", got)
	}
	tok, err := tokenizer.Parse(tiny(func(m map[string]any) {
		m["normalizer"] = map[string]any{"type": "NFKC"}
		m["added_tokens"] = append(m["added_tokens"].([]any),
			map[string]any{"id": 500, "content": "\ufb01x", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": true},
			map[string]any{"id": 501, "content": "Ab", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": true})
	}))
	if err != nil {
		t.Fatal(err)
	}
	fix, ab, x := tok.Encode(nil, "\ufb01x", false), tok.Encode(nil, "Ab", false), tok.Encode(nil, "<|x|>", false)
	if len(fix) != 1 || len(ab) != 1 || len(x) != 1 {
		t.Fatalf("added tokens encode as %v %v %v", fix, ab, x)
	}
	if s, _ := tok.Token(fix[0]); s != "fix" {
		t.Errorf("Token(%d) = %q, want the normalized text", fix[0], s)
	}
	if got := tok.Decode(slices.Concat(fix, ab, x), true); got != "fix" {
		t.Errorf("Decode(skipping special tokens) = %q, want %q", got, "fix")
	}
	if got := tok.Decode(slices.Concat(fix, ab, x), false); got != "fixAb<|x|>" {
		t.Errorf("Decode = %q, want %q", got, "fixAb<|x|>")
	}
}
