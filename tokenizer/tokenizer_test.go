package tokenizer_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

// tiny is a complete byte-level BPE tokenizer.json small enough to edit in
// tests: "ab" merges, "<|x|>" is a special added token.
func tiny(edit func(m map[string]any)) []byte {
	vocab := map[string]any{}
	for b := 0; b < 256; b++ {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF) {
			continue // the test never uses these bytes
		}
		vocab[string(r)] = len(vocab)
	}
	vocab["ab"] = len(vocab)
	vocab["<|x|>"] = len(vocab)
	m := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil,
		"added_tokens": []any{map[string]any{"id": vocab["<|x|>"], "content": "<|x|>", "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true}},
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": nil,
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocab, "merges": []any{"a b"}},
	}
	if edit != nil {
		edit(m)
	}
	b, _ := json.Marshal(m)
	return b
}

func model(m map[string]any) map[string]any { return m["model"].(map[string]any) }

func TestParseRefuses(t *testing.T) {
	tests := []struct {
		name string
		edit func(m map[string]any)
		want error
	}{
		{"WordPiece model", func(m map[string]any) { model(m)["type"] = "WordPiece" }, tokenizer.ErrUnsupported},
		{"unknown regex", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\w+`}, "behavior": "Isolated", "invert": false}
		}, tokenizer.ErrUnsupported},
		{"Lowercase normalizer", func(m map[string]any) { m["normalizer"] = map[string]any{"type": "Lowercase"} }, tokenizer.ErrUnsupported},
		{"regex Replace", func(m map[string]any) {
			m["normalizer"] = map[string]any{"type": "Replace", "pattern": map[string]any{"Regex": " +"}, "content": " "}
		}, tokenizer.ErrUnsupported},
		{"truncation", func(m map[string]any) { m["truncation"] = map[string]any{"max_length": 8} }, tokenizer.ErrUnsupported},
		{"dropout", func(m map[string]any) { model(m)["dropout"] = 0.1 }, tokenizer.ErrUnsupported},
		{"continuing_subword_prefix", func(m map[string]any) { model(m)["continuing_subword_prefix"] = "##" }, tokenizer.ErrUnsupported},
		{"end_of_word_suffix", func(m map[string]any) { model(m)["end_of_word_suffix"] = "</w>" }, tokenizer.ErrUnsupported},
		{"unknown option", func(m map[string]any) { model(m)["future_option"] = true }, tokenizer.ErrUnsupported},
		{"single_word", func(m map[string]any) {
			m["added_tokens"].([]any)[0].(map[string]any)["single_word"] = true
		}, tokenizer.ErrUnsupported},
		{"Digits pre-tokenizer", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Digits", "individual_digits": true}
		}, tokenizer.ErrUnsupported},
		{"merge outside vocab", func(m map[string]any) { model(m)["merges"] = []any{"a q"} }, tokenizer.ErrInvalid},
		{"merge not a pair", func(m map[string]any) { model(m)["merges"] = []any{"a"} }, tokenizer.ErrInvalid},
		{"no model", func(m map[string]any) { delete(m, "model") }, tokenizer.ErrInvalid},
		{"negative id", func(m map[string]any) { model(m)["vocab"].(map[string]any)["a"] = -1 }, tokenizer.ErrInvalid},
		{"unk not in vocab", func(m map[string]any) { model(m)["unk_token"] = "<unk>" }, tokenizer.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tokenizer.Parse(tiny(tt.edit))
			if !errors.Is(err, tt.want) {
				t.Fatalf("Parse: %v, want %v", err, tt.want)
			}
		})
	}
	if _, err := tokenizer.Parse([]byte("{")); !errors.Is(err, tokenizer.ErrInvalid) {
		t.Fatalf("Parse of broken JSON: %v", err)
	}
}

// tokenIDs returns a function giving the id of a token tok has, failing
// t for one it has not.
func tokenIDs(t *testing.T, tok *tokenizer.Tokenizer) func(string) uint32 {
	return func(s string) uint32 {
		t.Helper()
		v, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("no token %q", s)
		}
		return v
	}
}

func TestTinyTokenizer(t *testing.T) {
	tok, err := tokenizer.Parse(tiny(nil))
	if err != nil {
		t.Fatal(err)
	}
	id := tokenIDs(t, tok)
	tests := []struct {
		text string
		want []uint32
	}{
		{"ab", []uint32{id("ab")}},
		{"aab", []uint32{id("a"), id("ab")}},
		{"ab<|x|>ba", []uint32{id("ab"), id("<|x|>"), id("b"), id("a")}},
		{"", nil},
	}
	for _, tt := range tests {
		if got := tok.Encode(nil, tt.text, true); !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
	if !tok.IsSpecial(id("<|x|>")) || tok.IsSpecial(id("ab")) {
		t.Error("IsSpecial")
	}
	if s, ok := tok.Token(id("ab")); !ok || s != "ab" {
		t.Errorf("Token = %q, %v", s, ok)
	}
	if got := tok.Decode([]uint32{id("ab"), id("<|x|>"), id("a")}, true); got != "aba" {
		t.Errorf("Decode = %q", got)
	}
}

// TestDecodeGolden checks Decode (skipping special tokens) against the
// tokenizers library's decode of the same ids.
func TestDecodeGolden(t *testing.T) {
	for _, fam := range families {
		tok, err := tokenizer.FromFile(filepath.Join("testdata", fam, "tokenizer.json"))
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range readGolden(t, fam).Texts {
			if got := tok.Decode(g.IDsSpecial, true); got != g.Decoded {
				t.Errorf("%s: Decode(%v) = %q, want %q", fam, g.IDsSpecial, got, g.Decoded)
			}
		}
	}
}

func TestLoadModelErrors(t *testing.T) {
	if _, err := tokenizer.LoadModel(t.TempDir(), tokenizer.LoadOptions{}); err == nil {
		t.Fatal("LoadModel of an empty directory succeeded")
	}
	m, err := tokenizer.LoadModel(filepath.Join("testdata", "llama3"), tokenizer.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.RenderChat(&tokenizer.Chat{Messages: json.RawMessage(`[]`)}); !errors.Is(err, tokenizer.ErrInvalid) {
		t.Errorf("empty chat: %v", err)
	}
	if _, err := m.RenderChat(&tokenizer.Chat{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), Template: "nope"}); !errors.Is(err, tokenizer.ErrNoTemplate) {
		t.Errorf("unknown template: %v", err)
	}
	if m.SpecialTokens["bos_token"] != "<|begin_of_text|>" {
		t.Errorf("SpecialTokens = %v", m.SpecialTokens)
	}
}

// TestEncodeConcurrent encodes from several goroutines at once (the piece
// cache is shared) and checks every result.
func TestEncodeConcurrent(t *testing.T) {
	for _, fam := range []string{"llama3", "unigram"} {
		tok, err := tokenizer.FromFile(filepath.Join("testdata", fam, "tokenizer.json"))
		if err != nil {
			t.Fatal(err)
		}
		texts := readGolden(t, fam).Texts
		errs := make(chan string, 8)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				var dst []uint32
				for i := range 5 * len(texts) {
					want := texts[(i+g*7)%len(texts)]
					if dst = tok.Encode(dst[:0], want.Text, true); !slices.Equal(dst, want.IDsSpecial) {
						errs <- fmt.Sprintf("%s: Encode(%q) = %v, want %v", fam, want.Text, dst, want.IDsSpecial)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
	}
}

// TestTemplateFiles: chat_template.jinja and additional_chat_templates/
// take priority over tokenizer_config.json's template, and "tool_use" is
// chosen when tools are given.
func TestTemplateFiles(t *testing.T) {
	dir := t.TempDir()
	tj := readFile(t, filepath.Join("testdata", "llama3", "tokenizer.json"))
	files := map[string]string{
		"tokenizer.json":                           string(tj),
		"tokenizer_config.json":                    `{"chat_template": "config", "eos_token": {"content": "<|eot_id|>"}}`,
		"chat_template.jinja":                      "default {{ messages | length }} {{ eos_token }}\n",
		"additional_chat_templates/tool_use.jinja": "tools {{ tools | length }}",
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := tokenizer.LoadModel(dir, tokenizer.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := json.RawMessage(`[{"role": "user", "content": "x"}]`)
	tests := []struct {
		chat tokenizer.Chat
		want string
	}{
		{tokenizer.Chat{Messages: msgs}, "default 1 <|eot_id|>"},
		{tokenizer.Chat{Messages: msgs, Tools: json.RawMessage(`[{}, {}]`)}, "tools 2"},
		{tokenizer.Chat{Messages: msgs, Tools: json.RawMessage(`[{}]`), Template: "default"}, "default 1 <|eot_id|>"},
	}
	for _, tt := range tests {
		if got, err := m.RenderChat(&tt.chat); err != nil || got != tt.want {
			t.Errorf("RenderChat(%+v) = %q, %v; want %q", tt.chat, got, err, tt.want)
		}
	}
}

// TestEncodeAllocatesNothing: once the piece cache is warm, encoding into
// a slice with room allocates nothing, special tokens included.
func TestEncodeAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items")
	}
	for _, fam := range []string{"gpt2", "llama3"} { // byte-level; Metaspace rewrites each piece
		tok, err := tokenizer.FromFile(filepath.Join("testdata", fam, "tokenizer.json"))
		if err != nil {
			t.Fatal(err)
		}
		text := "Hello world, the router's cache: 42 tokens\n\n  and more <|eot_id|> text"
		dst := tok.Encode(nil, text, true)
		if allocs := testing.AllocsPerRun(100, func() { dst = tok.Encode(dst[:0], text, true) }); allocs != 0 {
			t.Errorf("%s: Encode allocates %v times", fam, allocs)
		}
	}
}
