package tokenizer_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/kvroute/kvroute/tokenizer"
)

// variant is a test tokenizer.json: a fixture under testdata with some of
// its fields rewritten.
type variant struct {
	name string
	base string // family under testdata
	edit func(file map[string]any)
}

// modelOf returns the "model" object of a tokenizer.json.
func modelOf(file map[string]any) map[string]any { return file["model"].(map[string]any) }

// withAdded appends added tokens (id after the largest id in use).
func withAdded(file map[string]any, tokens ...map[string]any) {
	next := 0.0
	for _, v := range vocabIDs(file) {
		next = max(next, v+1)
	}
	list, _ := file["added_tokens"].([]any)
	for _, t := range tokens {
		a := map[string]any{"single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}
		for k, v := range t {
			a[k] = v
		}
		a["id"] = next
		next++
		list = append(list, a)
	}
	file["added_tokens"] = list
}

// vocabIDs lists every id of the model's vocab and the added tokens.
func vocabIDs(file map[string]any) []float64 {
	var ids []float64
	m := modelOf(file)
	switch v := m["vocab"].(type) {
	case map[string]any:
		for _, id := range v {
			ids = append(ids, id.(float64))
		}
	case []any:
		for i := range v {
			ids = append(ids, float64(i))
		}
	}
	list, _ := file["added_tokens"].([]any)
	for _, a := range list {
		ids = append(ids, a.(map[string]any)["id"].(float64))
	}
	return ids
}

func tok(content string, flags ...string) map[string]any {
	t := map[string]any{"content": content}
	for _, f := range flags {
		t[f] = true
	}
	return t
}

// differentialVariants are tokenizer.json files beyond the fixtures:
// every normalizer before Metaspace's "first" scheme, added tokens with
// every flag, byte fallback and unknown tokens on and off, Unigram with
// byte fallback.
var differentialVariants = []variant{
	{"gpt2", "gpt2", nil},
	{"gpt2/prefix-space", "gpt2", func(f map[string]any) {
		f["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}
	}},
	{"gpt2/no-regex", "gpt2", func(f map[string]any) {
		f["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
	}},
	{"llama3", "llama3", nil},
	{"llama3/merges", "llama3", func(f map[string]any) { modelOf(f)["ignore_merges"] = false }},
	{"llama3/nfkc", "llama3", func(f map[string]any) { f["normalizer"] = map[string]any{"type": "NFKC"} }},
	{"llama3/added-flags", "llama3", func(f map[string]any) {
		withAdded(f, tok("<|l|>", "lstrip", "special"), tok("<|r|>", "rstrip", "special"), tok("<|lr|>", "lstrip", "rstrip"),
			tok(" sp ", "special"), tok("cache"), tok("the", "normalized"), tok("<|n|>", "normalized", "special"))
	}},
	{"qwen2", "qwen2", nil},
	{"qwen2/nfkd", "qwen2", func(f map[string]any) { f["normalizer"] = map[string]any{"type": "NFKD"} }},
	{"mistral", "mistral", nil},
	{"mistral/split", "mistral", func(f map[string]any) {
		f["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}
	}},
	{"mistral/never", "mistral", func(f map[string]any) {
		f["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": false}
	}},
	{"mistral/nfc", "mistral", func(f map[string]any) { f["normalizer"] = map[string]any{"type": "NFC"} }},
	{"mistral/nfkc", "mistral", func(f map[string]any) { f["normalizer"] = map[string]any{"type": "NFKC"} }},
	{"mistral/nfd", "mistral", func(f map[string]any) { f["normalizer"] = map[string]any{"type": "NFD"} }},
	{"mistral/nfkd", "mistral", func(f map[string]any) { f["normalizer"] = map[string]any{"type": "NFKD"} }},
	{"mistral/nfkc-prepend", "mistral", func(f map[string]any) {
		f["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "NFKC"}, map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"}}}
		f["pre_tokenizer"] = nil
	}},
	{"mistral/no-fallback", "mistral", func(f map[string]any) { modelOf(f)["byte_fallback"] = false }},
	{"mistral/no-fuse", "mistral", func(f map[string]any) {
		modelOf(f)["byte_fallback"] = false
		modelOf(f)["fuse_unk"] = false
	}},
	{"mistral/no-unk", "mistral", func(f map[string]any) {
		modelOf(f)["byte_fallback"] = false
		modelOf(f)["unk_token"] = nil
	}},
	{"mistral/added-flags", "mistral", func(f map[string]any) {
		f["normalizer"] = map[string]any{"type": "NFKC"}
		withAdded(f, tok("<|l|>", "lstrip", "special"), tok("<|r|>", "rstrip", "special"), tok("<|lr|>", "lstrip", "rstrip"),
			tok("\ufb01ne", "normalized"), tok("Å", "normalized"), tok(" the", "normalized"), tok("▁x"), tok("e\u0301", "normalized", "special"))
	}},
	{"mistral/strip-replace", "mistral", func(f map[string]any) {
		f["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Strip", "strip_left": true, "strip_right": true},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "\r\n"}, "content": "\n"},
			map[string]any{"type": "NFC"}}}
	}},
	{"mistral/split-literal", "mistral", func(f map[string]any) {
		f["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"String": "\n"}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}}}
	}},
	{"mistral/ignore-merges", "mistral", func(f map[string]any) { modelOf(f)["ignore_merges"] = true }},
	{"mistral/dropout-zero", "mistral", func(f map[string]any) { modelOf(f)["dropout"] = 0.0 }},
	{"mistral/dropout", "mistral", func(f map[string]any) { modelOf(f)["dropout"] = 0.5 }},
	{"mistral/empty-prefix", "mistral", func(f map[string]any) {
		modelOf(f)["continuing_subword_prefix"] = ""
		modelOf(f)["end_of_word_suffix"] = ""
	}},
	{"gpt2/nfc-added", "gpt2", func(f map[string]any) {
		f["normalizer"] = map[string]any{"type": "NFC"}
		f["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}
		withAdded(f, tok("<|l|>", "lstrip", "special"), tok("<|r|>", "rstrip"), tok("Å", "normalized"), tok(" sp ", "normalized"))
	}},
	{"gpt2/unk", "gpt2", func(f map[string]any) {
		m := modelOf(f)
		vocab := m["vocab"].(map[string]any)
		for k := range vocab {
			if k == "Ã" || k == "¤" {
				delete(vocab, k)
			}
		}
		m["merges"] = slices.DeleteFunc(m["merges"].([]any), func(x any) bool {
			s := fmt.Sprint(x)
			return strings.Contains(s, "Ã") || strings.Contains(s, "¤")
		})
		vocab["<unk>"] = float64(len(vocab) + 100)
		m["unk_token"] = "<unk>"
	}},
	{"mistral/underscore-prepend", "mistral", func(f map[string]any) {
		f["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "_"}, map[string]any{"type": "NFKD"}}}
		f["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "_", "prepend_scheme": "first", "split": true}
		withAdded(f, tok(" <|l|>", "lstrip"), tok("<|a|>", "special"), tok("<|a|>b", "special"), tok("  x  ", "normalized"))
	}},
	{"mistral/strip-added", "mistral", func(f map[string]any) {
		f["normalizer"] = map[string]any{"type": "Strip", "strip_left": true, "strip_right": true}
		withAdded(f, tok("  x  ", "normalized"), tok("\n", "rstrip", "lstrip"))
	}},
	{"mistral/strip-empty", "mistral", func(f map[string]any) {
		f["normalizer"] = map[string]any{"type": "Strip", "strip_left": true, "strip_right": true}
		withAdded(f, tok(" ", "normalized"))
	}},
	{"unigram", "unigram", nil},
	{"unigram/byte-fallback", "unigram", func(f map[string]any) { modelOf(f)["byte_fallback"] = true }},
	{"unigram/first", "unigram", func(f map[string]any) {
		modelOf(f)["byte_fallback"] = true
		f["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}
	}},
	{"unigram/added", "unigram", func(f map[string]any) {
		modelOf(f)["byte_fallback"] = true
		withAdded(f, tok("<|l|>", "lstrip", "special"), tok("<|r|>", "rstrip", "special"), tok("the", "normalized"), tok("▁x"), tok("ＡＢ", "normalized"))
	}},
	{"unigram/nfd-first", "unigram", func(f map[string]any) {
		f["normalizer"] = map[string]any{"type": "NFD"}
		f["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false}
	}},
}

// edgeTexts are inputs the golden corpus does not reach.
var edgeTexts = []string{
	"\u0301abc", "a\uff9e\u0308\uff9e", "\uff9e\u0308\uff9e", "\u0301", "\u0301\u0301 e", "\u0308a", "\u0327\u0301c", "\u0345x", "\u093f", "\u1100\u1161\u11a8", "\uac00\u11a8",
	"e\u0301", "\u212b", "\u2126 ohm", "\ufb01", "\ufb01ne", " \ufb01ne", "\u00bd", "\u2460", "\u3000x", "\uff21\uff22",
	"👨\u200d👩\u200d👧\u200d👦", "👩🏽\u200d💻 ok", "🏳️\u200d🌈", "\u200d", "\u200b\u200b", "\ufeffbom", "🇺🇸🇫🇷", "1\ufe0f\u20e3",
	"\xff", "\xfe\xff", "a\xe6\x97", "\xe6\x97\xa5\xe6\x97", "\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80", "ok\x80ok", "\xf0\x9f\x98",
	"   ", "\t\t \n", " \n \n ", "a  b   c    d", "\r\n", "a\r\nb\r\n\r\n", "\r", "\r\r\n\n", " \r\n ", "x \r\n\ty",
	"\u00a0", "a\u00a0b", "\u00a0\u00a0 x", " \u00a0", "\u2028\u2029", "\u0085", "\u000b\u000c",
	"東京タワー", "中文，标点。", "ｶﾀｶﾅ", "한국어", "1234567890", "12 345 6789", "٠١٢٣٤", "१२३", "3.14e-10", "1,000,000.00", "x²³",
	"<|a|>b", "<|a|><|a|>bb", "  x  y", " x ", "\n\n \n", "<|l|>", " <|l|> ", "a<|l|>b", "  <|r|>  x", "a<|r|>\n\nb", "<|lr|>", " \n<|lr|>\n ", "<|l|><|r|><|lr|>", "<s><s></s>", "[INST]x[/INST]",
	"sp sp sp", "the the", "cache cached", "<|n|>", "fine ﬁne", "ÅA\u030a", "ex\u0301", "▁x x▁x", "\u0301<|l|>",
	"<unk>", "<0x41>", "<mask>", " <mask>", "<|im_start|>", "<|im_start|><|im_end|>", "<|begin_of_text|>",
	"\U0001E030b", "\U0001FBF0 x", "\u1abf\u0301a", "\ufb01\U0001E030", "a\U0001E030b", "x\U00011F04y 1", "\U00010D4A\U00010D4B", "\U0001CCF5\U0001CCF6", "\U00031350\U00031351", "\u0CF3k", "\U0001FAE8 \U0001FA89",
	"\U00016D40\U00016D41", "\U0001E4D0x", "\U0001FBF0\U0001FBF1", "\u2FFC\u31E4", "\U0002EBF0", "\U000F0000\U0010FFFD", "\uE000\uFDD0\uFFFE",
	"\U000105C0\U000105C1 x\U000105C2", "\U00010D40\U00010D41\U00010D42\U00010D43\U00010D44", "a\U00013460b", " \U0001E5D0\U0001E5F1",
	"'S'T'RE 'Ll", "don't", "''''", "a'b", "'\u0301",
}

// longTexts are inputs past every cache and buffer size, bounded so that
// the Python reference answers in a few seconds.
func longTexts() []string {
	return []string{
		strings.Repeat("a", 5000),
		strings.Repeat("ab", 3000),
		strings.Repeat("東", 2000),
		strings.Repeat("😀", 1000),
		strings.Repeat(" ", 3000) + "x",
		strings.Repeat("\n", 2000),
		strings.Repeat("1", 4000),
		strings.Repeat("\u0301", 1000),
		strings.Repeat("\xff", 1000),
		strings.Repeat("supercalifragilistic", 300),
		strings.Repeat("e\u0301", 1500),
	}
}

// differentialPieces extends livePieces with what the edge texts test.
var differentialPieces = append(slices.Clone(livePieces),
	"\u0301", "\u0308", "\u200d", "\xff", "\xe6\x97", "\r\n", "\r", "\u00a0", "\u00a0\u00a0", "<|l|>", "<|r|>", "<|lr|>", " sp ",
	"cache", "Å", "\u212b", "▁", "▁x", "\ufb01", "12345678", "٣٤", " \n ", "\t\n", "e\u0301", "🏽", "\ufe0f", "<0x41>", "<|a|>", "b", " x ", "_",
	"\x00", "\x1b[0m", "\x7f", "\ufffd", "\u00ad", "\u2060", "\U0001F9D1\u200D\U0001F384", "\U000105C0", "\U0001E030", "\u1abf", "\U00010D40", "\u0345", "\u0f73", "ﾞ", "\u3099")

func randomDifferentialText(rng *rand.Rand, n int) string {
	var b strings.Builder
	for range rng.IntN(n) + 1 {
		b.WriteString(differentialPieces[rng.IntN(len(differentialPieces))])
	}
	return b.String()
}

// variantFile returns v's tokenizer.json.
func variantFile(t testing.TB, v variant) []byte {
	t.Helper()
	var file map[string]any
	if err := json.Unmarshal(readFile(t, filepath.Join("testdata", v.base, "tokenizer.json")), &file); err != nil {
		t.Fatal(err)
	}
	if v.edit != nil {
		v.edit(file)
	}
	b, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// referenceResult is what `reference.py encode` prints for one tokenizer.
type referenceResult struct {
	Error      string     `json:"error"`
	IDs        [][]uint32 `json:"ids"`
	IDsSpecial [][]uint32 `json:"ids_special"`
	Decoded    []*string  `json:"decoded"`
}

// referenceEncode runs `reference.py encode` on files and texts.
func referenceEncode(t *testing.T, py string, files [][]byte, texts []string) []referenceResult {
	t.Helper()
	docs := make([]string, len(files))
	for i, f := range files {
		docs[i] = string(f)
	}
	enc := make([]string, len(texts))
	for i, s := range texts {
		enc[i] = base64.StdEncoding.EncodeToString([]byte(s))
	}
	var res []referenceResult
	runReference(t, py, "encode", map[string]any{"tokenizers": docs, "texts": enc}, &res)
	if len(res) != len(files) {
		t.Fatalf("reference answered for %d tokenizers of %d", len(res), len(files))
	}
	return res
}

// checkDifferential encodes texts with every variant and compares the ids
// with the reference's. A variant this package refuses must be refused
// with ErrUnsupported; one the reference refuses must be refused too.
func checkDifferential(t *testing.T, py string, variants []variant, texts []string) {
	t.Helper()
	files := make([][]byte, len(variants))
	for i, v := range variants {
		files[i] = variantFile(t, v)
	}
	ref := referenceEncode(t, py, files, texts)
	for i, v := range variants {
		tk, err := tokenizer.Parse(files[i])
		switch {
		case ref[i].Error != "" && err == nil:
			t.Errorf("%s: loads, but the reference refuses it: %s", v.name, ref[i].Error)
			continue
		case ref[i].Error != "":
			continue
		case err != nil && !errors.Is(err, tokenizer.ErrUnsupported):
			t.Errorf("%s: %v", v.name, err)
			continue
		case err != nil:
			t.Logf("%s: refused: %v", v.name, err)
			continue
		}
		bad, failed := 0, 0
		for j, text := range texts {
			if ref[i].IDs[j] == nil || ref[i].IDsSpecial[j] == nil {
				failed++ // tokenizers panics on it: nothing to compare
				tk.Encode(nil, text, true)
				continue
			}
			got := tk.Encode(nil, text, false)
			gotSpecial := tk.Encode(nil, text, true)
			if d := tk.Decode(ref[i].IDsSpecial[j], true); d != *ref[i].Decoded[j] {
				if bad++; bad <= 5 {
					t.Errorf("%s: Decode(%v) = %q, want %q", v.name, ref[i].IDsSpecial[j], d, *ref[i].Decoded[j])
				}
			}
			if !slices.Equal(got, ref[i].IDs[j]) || !slices.Equal(gotSpecial, ref[i].IDsSpecial[j]) {
				if bad++; bad <= 5 {
					t.Errorf("%s: Encode(%s) differs: %s; with special tokens: %s", v.name, shortQuote(text), idsDiff(got, ref[i].IDs[j]), idsDiff(gotSpecial, ref[i].IDsSpecial[j]))
				}
			}
		}
		if bad > 5 {
			t.Errorf("%s: %d texts of %d differ", v.name, bad, len(texts))
		}
		if failed > 0 {
			t.Logf("%s: tokenizers fails on %d texts of %d", v.name, failed, len(texts))
		}
	}
}

// idsDiff shows where got first differs from want.
func idsDiff(got, want []uint32) string {
	if slices.Equal(got, want) {
		return "equal"
	}
	k := 0
	for k < len(got) && k < len(want) && got[k] == want[k] {
		k++
	}
	lo := max(k-3, 0)
	return fmt.Sprintf("%d ids, want %d; from id %d: %v, want %v", len(got), len(want), lo, got[lo:min(k+6, len(got))], want[lo:min(k+6, len(want))])
}

func shortQuote(s string) string {
	if len(s) > 120 {
		return fmt.Sprintf("%q... (%d bytes)", s[:120], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// TestDifferentialEdges compares every variant with the Python reference
// on the edge texts and the long ones.
func TestDifferentialEdges(t *testing.T) {
	py := referencePython(t)
	checkDifferential(t, py, differentialVariants, append(slices.Clone(edgeTexts), longTexts()...))
}

// TestDifferentialRandom compares every variant with the Python reference
// on random concatenations of the pieces the pre-tokenizers, normalizers
// and added tokens tell apart (see testSeed for the seed).
func TestDifferentialRandom(t *testing.T) {
	py := referencePython(t)
	seed := testSeed(t, 1795506740523232996)
	rng := rand.New(rand.NewPCG(seed, 29))
	n := 400
	if testing.Short() {
		n = 50
	}
	texts := make([]string, n)
	for i := range texts {
		texts[i] = randomDifferentialText(rng, 24)
	}
	checkDifferential(t, py, differentialVariants, texts)
}

// TestUnknownToReferenceTable checks the table of characters the Python
// reference's normalizers do not know against the reference itself: every
// character x/text decomposes or gives a combining class above 1 is asked
// about, and those the reference leaves whole (or does not reorder) must
// be exactly the table's; every other must decompose alike.
func TestUnknownToReferenceTable(t *testing.T) {
	py := referencePython(t)
	var cps []rune
	for r := rune(0x80); r <= unicode.MaxRune; r++ {
		if utf8.ValidRune(r) && (norm.NFKD.String(string(r)) != string(r) || norm.NFD.PropertiesString(string(r)).CCC() > 1) {
			cps = append(cps, r)
		}
	}
	var ref struct {
		NFD, NFKD []string
		Reorders  []bool
	}
	runReference(t, py, "unicode", map[string]any{"cps": cps}, &ref)
	if len(ref.NFD) != len(cps) || len(ref.NFKD) != len(cps) || len(ref.Reorders) != len(cps) {
		t.Fatalf("reference answered for %d, %d, %d code points of %d", len(ref.NFD), len(ref.NFKD), len(ref.Reorders), len(cps))
	}
	for i, r := range cps {
		s := string(r)
		goD, goKD, ccc := norm.NFD.String(s), norm.NFKD.String(s), norm.NFD.PropertiesString(s).CCC()
		unknown := (goD != s || goKD != s) && ref.NFD[i] == s && ref.NFKD[i] == s || ccc > 1 && !ref.Reorders[i]
		if unknown != tokenizer.UnknownToRef(r) {
			t.Errorf("U+%04X: unknown to the reference %v, in the table %v", r, unknown, !unknown)
		}
		if !unknown && (ref.NFD[i] != goD || ref.NFKD[i] != goKD) {
			t.Errorf("U+%04X: the reference decomposes it as %+q / %+q, x/text as %+q / %+q", r, ref.NFD[i], ref.NFKD[i], goD, goKD)
		}
	}
}

// TestNewerCharacterClasses checks the letters and numbers Go's unicode
// package does not know against the Python reference: every code point's
// \p{L} and \p{N} there must be unicode.IsLetter and IsNumber or the
// tables' newer characters.
func TestNewerCharacterClasses(t *testing.T) {
	py := referencePython(t)
	var ref struct{ L, N []rune }
	runReference(t, py, "classes", nil, &ref)
	for _, c := range []struct {
		name string
		ref  []rune
		is   func(rune) bool
	}{{"L", ref.L, tokenizer.IsLetter}, {"N", ref.N, tokenizer.IsNumber}} {
		want := make(map[rune]bool, len(c.ref))
		for _, r := range c.ref {
			want[r] = true
		}
		bad := 0
		for r := rune(0); r <= unicode.MaxRune; r++ {
			if utf8.ValidRune(r) && c.is(r) != want[r] {
				if bad++; bad <= 10 {
					t.Errorf("U+%04X: \\p{%s} %v in the reference, %v here", r, c.name, want[r], c.is(r))
				}
			}
		}
	}
}

// testSeed returns the seed of a test drawing texts at random: def, or
// what KVROUTE_TOKENIZER_SEED says (a number, or "random" for one from
// the clock). It is logged, so a failure names the seed that replays it.
func testSeed(t *testing.T, def uint64) uint64 {
	t.Helper()
	seed := def
	switch s := os.Getenv("KVROUTE_TOKENIZER_SEED"); s {
	case "":
	case "random":
		seed = uint64(time.Now().UnixNano())
	default:
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatalf("KVROUTE_TOKENIZER_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d", seed)
	return seed
}
