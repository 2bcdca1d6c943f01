package tokenizer_test

import (
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenizer"
)

// FuzzParse: any tokenizer.json loads or fails with an error, never
// panics, and a loaded tokenizer encodes and decodes without panicking.
func FuzzParse(f *testing.F) {
	f.Add(tiny(nil))
	f.Add(tiny(func(m map[string]any) {
		m["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}
		m["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFKC"}, map[string]any{"type": "Prepend", "prepend": "▁"}}}
		m["post_processor"] = map[string]any{"type": "TemplateProcessing", "single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<|x|>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair": nil, "special_tokens": map[string]any{"<|x|>": map[string]any{"id": "<|x|>", "ids": []any{1}, "tokens": []any{"<|x|>"}}}}
	}))
	f.Add([]byte(`{"model":{"type":"Unigram","unk_id":0,"vocab":[["<unk>",0],["a",-1],["ab",-2]],"byte_fallback":true}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[["a","a"]]}}`))
	for _, fam := range families {
		if b, err := os.ReadFile(filepath.Join("testdata", fam, "tokenizer.json")); err == nil && len(b) < 64<<10 {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := tokenizer.Parse(data)
		if err != nil {
			return
		}
		for _, s := range []string{"", "ab a\u00a0b", "<|x|> 12 ab\n\n", "\xff\xfe", "東京😀 e\u0301"} {
			ids := tok.Encode(nil, s, true)
			_ = tok.Decode(ids, false)
		}
	})
}

// FuzzEncode: Encode never panics on any string, and byte-level decoding
// gives the text back (the llama3 test tokenizer has no normalizer).
func FuzzEncode(f *testing.F) {
	tok, err := tokenizer.FromFile(filepath.Join("testdata", "llama3", "tokenizer.json"))
	if err != nil {
		f.Fatal(err)
	}
	uni, err := tokenizer.FromFile(filepath.Join("testdata", "unigram", "tokenizer.json"))
	if err != nil {
		f.Fatal(err)
	}
	mis, err := tokenizer.FromFile(filepath.Join("testdata", "mistral", "tokenizer.json"))
	if err != nil {
		f.Fatal(err)
	}
	for _, g := range readGolden(f, "llama3").Texts {
		f.Add(g.Text)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(nil, s, false)
		want := s
		if !utf8.ValidString(s) {
			want = lossyUTF8(s) // each maximal ill-formed subpart reads as U+FFFD
		}
		if got := tok.Decode(ids, false); got != want {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
		uni.Encode(nil, s, true)
		mis.Encode(nil, s, true)
	})
}

// FuzzEncodeVariants: Encode and Decode never panic, whatever the text,
// with any of the differential test's tokenizers (every normalizer,
// pre-tokenizer and added-token option the package supports), which the
// fuzzer picks by its first argument.
func FuzzEncodeVariants(f *testing.F) {
	var toks []*tokenizer.Tokenizer
	for _, v := range differentialVariants {
		if tok, err := tokenizer.Parse(variantFile(f, v)); err == nil {
			toks = append(toks, tok)
		}
	}
	if len(toks) == 0 {
		f.Fatal("no variant parses")
	}
	for i, s := range edgeTexts {
		f.Add(uint8(i), s)
	}
	for i := range toks {
		// Texts that once crashed a variant, with every variant.
		f.Add(uint8(i), "caf\u00e97\uff9e\u0308\uff9e sp (cache?\u00ad@<|eot_id|>3.14Zrouter\t\n123456<|im_end|>\u6771\u4eac12345678")
	}
	f.Fuzz(func(t *testing.T, pick uint8, s string) {
		tok := toks[int(pick)%len(toks)]
		for _, special := range []bool{false, true} {
			ids := tok.Encode(nil, s, special)
			_ = tok.Decode(ids, false)
			_ = tok.Decode(ids, true)
		}
	})
}

// FuzzEncodeRequest: whatever body a client sends, parsing it and encoding
// it with any test model's tokenizer and chat template answers ids or an
// error, never a panic (the gateway and the picker run this on every
// request).
func FuzzEncodeRequest(f *testing.F) {
	var models []*tokenizer.Model
	for _, fam := range families {
		m, err := tokenizer.LoadModel(filepath.Join("testdata", fam), tokenizer.LoadOptions{})
		if err != nil {
			f.Fatal(err)
		}
		models = append(models, m)
	}
	seeds := []string{
		`{"model":"m","messages":[{"role":"system","content":"You are kind."},{"role":"user","content":"Hi <|eot_id|> there"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"add_generation_prompt":false}`,
		`{"messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"get","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","content":"sunny","tool_call_id":"1"}],"tools":[{"type":"function","function":{"name":"get","parameters":{"type":"object"}}}]}`,
		`{"messages":[{"role":"assistant","content":"x"},{"role":"user","content":"caf\u00e97\uff9e\u0308\uff9e"}],"chat_template_kwargs":{"enable_thinking":true}}`,
		`{"messages":[{"role":"weird","content":{"nested":[1,2,{"a":null}]}}]}`,
		`{"prompt":"hello world","add_special_tokens":false}`,
		`{"prompt":[1,2,3]}`,
	}
	for i, s := range seeds {
		f.Add(uint8(i), []byte(s))
	}
	f.Fuzz(func(t *testing.T, pick uint8, body []byte) {
		m := models[int(pick)%len(models)]
		kind := openai.KindChat
		if pick&0x80 != 0 {
			kind = openai.KindCompletion
		}
		req, err := openai.ParseRequest(body, kind)
		if err != nil {
			return
		}
		_, _ = m.EncodeRequest(nil, req)
	})
}
