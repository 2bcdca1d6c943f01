package tokenizer_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenizer"
)

// benchText is about n bytes of the golden corpus (mixed scripts, code,
// numbers, white space).
func benchText(b *testing.B, fam string, n int) string {
	var sb strings.Builder
	for sb.Len() < n {
		for _, g := range readGolden(b, fam).Texts {
			sb.WriteString(g.Text)
			sb.WriteByte(' ')
		}
	}
	return sb.String()[:n]
}

// BenchmarkEncode measures Encode in steady state (the piece cache warm),
// reporting tokens/s.
func BenchmarkEncode(b *testing.B) {
	for _, fam := range families {
		tok, err := tokenizer.FromFile(filepath.Join("testdata", fam, "tokenizer.json"))
		if err != nil {
			b.Fatal(err)
		}
		for _, size := range []int{1 << 10, 16 << 10} {
			text := benchText(b, fam, size)
			b.Run(fmt.Sprintf("family=%s/text=%dk", fam, size>>10), func(b *testing.B) {
				dst := tok.Encode(nil, text, true)
				n := len(dst)
				b.SetBytes(int64(len(text)))
				b.ReportAllocs()
				for b.Loop() {
					dst = tok.Encode(dst[:0], text, true)
				}
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}

// BenchmarkEncodeChat measures rendering and encoding one chat with tools.
func BenchmarkEncodeChat(b *testing.B) {
	for _, fam := range []string{"llama3", "qwen2"} {
		m, err := tokenizer.LoadModel(filepath.Join("testdata", fam), tokenizer.LoadOptions{})
		if err != nil {
			b.Fatal(err)
		}
		var chat *tokenizer.Chat
		for _, c := range readRawChats(b, fam) {
			if c.Error == "" && len(c.Tools) > 0 {
				chat = c.chat()
				break
			}
		}
		b.Run("family="+fam, func(b *testing.B) {
			ids, err := m.EncodeChat(nil, chat)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				ids, _ = m.EncodeChat(ids[:0], chat)
			}
			b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkEncodeRequest measures what a gateway spends on one chat
// request before routing it: parsing the body (openai.ParseRequest) and
// encoding its prompt (EncodeRequest), for a system prompt of about 1,400
// words and a question of 200, reporting prompt tokens/s.
func BenchmarkEncodeRequest(b *testing.B) {
	for _, fam := range []string{"llama3", "qwen2"} {
		m, err := tokenizer.LoadModel(filepath.Join("testdata", fam), tokenizer.LoadOptions{})
		if err != nil {
			b.Fatal(err)
		}
		words := strings.Fields(benchText(b, fam, 64<<10))
		body, err := json.Marshal(map[string]any{
			"model": "m", "stream": true, "max_tokens": 64,
			"messages": []map[string]string{
				{"role": "system", "content": strings.Join(words[:1400], " ")},
				{"role": "user", "content": strings.Join(words[1400:1600], " ")},
			},
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Run("family="+fam, func(b *testing.B) {
			var ids []uint32
			b.ReportAllocs()
			for b.Loop() {
				req, err := openai.ParseRequest(body, openai.KindChat)
				if err != nil {
					b.Fatal(err)
				}
				if ids, err = m.EncodeRequest(ids[:0], req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkEncodeManyAddedTokens measures Encode with Llama 3's 256
// "<|reserved_special_token_N|>" added tokens, which share their first
// bytes, on the golden corpus and on text made of "<|" (every position
// starts to match every token).
func BenchmarkEncodeManyAddedTokens(b *testing.B) {
	var file map[string]any
	if err := json.Unmarshal(readFile(b, filepath.Join("testdata", "llama3", "tokenizer.json")), &file); err != nil {
		b.Fatal(err)
	}
	var reserved []map[string]any
	for i := range 256 {
		reserved = append(reserved, tok(fmt.Sprintf("<|reserved_special_token_%d|>", i), "special"))
	}
	withAdded(file, reserved...)
	raw, err := json.Marshal(file)
	if err != nil {
		b.Fatal(err)
	}
	tk, err := tokenizer.Parse(raw)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, text string }{
		{"corpus", benchText(b, "llama3", 16<<10)},
		{"markup", strings.Repeat("<|", 8<<10)},
	} {
		b.Run("text="+c.name, func(b *testing.B) {
			dst := tk.Encode(nil, c.text, false)
			n := len(dst)
			b.SetBytes(int64(len(c.text)))
			b.ReportAllocs()
			for b.Loop() {
				dst = tk.Encode(dst[:0], c.text, false)
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
