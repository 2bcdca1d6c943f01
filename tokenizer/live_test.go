package tokenizer_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

// referencePython returns a Python that imports tokenizers, transformers
// and jinja2 ($KVROUTE_TOKENIZERS_PYTHON, set by .ci/setup-tokenizers.sh,
// else python3), or skips the test naming what is missing; with
// KVROUTE_EXTERNAL_TESTS=1 a missing dependency fails the test instead.
func referencePython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("KVROUTE_TOKENIZERS_PYTHON")
	if py == "" {
		py = "python3"
	}
	out, err := exec.Command(py, "-c", "import tokenizers, transformers, jinja2").CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("the Python reference needs %s with tokenizers, transformers and jinja2 (see .ci/setup-tokenizers.sh): %v: %s", py, err, lastLine(out))
		if os.Getenv("KVROUTE_EXTERNAL_TESTS") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return py
}

// runReference runs `reference.py command` with req, when not nil, as its
// JSON input, and decodes its JSON output into res.
func runReference(t *testing.T, py, command string, req, res any) {
	t.Helper()
	cmd := exec.Command(py, filepath.Join("testdata", "reference.py"), command)
	if req != nil {
		in, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdin = bytes.NewReader(in)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference: %v: %s", err, stderr.String())
	}
	if err := json.Unmarshal(out, res); err != nil {
		t.Fatal(err)
	}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// pieces of random text: every class the pre-tokenizers tell apart.
var livePieces = []string{
	"a", "Z", "é", "ß", "東京", "の", "한", "Я", "λ", "ا", "ह", "e\u0301", "n\u0303", "\u0308", "😀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷",
	"0", "7", "42", "123456", "3.14", "½", "٣", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2003",
	".", ",", "!", "?", "'s", "'T", "'re", "'LL", "'d", "'", "\"", "(", ")", "{", "}", "<", ">", "-", "_", "/", "\\", "#", "@",
	"hello", "World", "the", "tokenizer", "supercalifragilistic", "router", " cache", " model", "naïve", "café",
	"<|begin_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "[INST]", "[/INST]", "<tool_call>", "<unk>",
	"<mask>", " <mask>", "<|rs|>", "\ufb01ne", "fine",
}

func randomText(rng *rand.Rand, n int) string {
	var b strings.Builder
	for range rng.IntN(n) + 1 {
		b.WriteString(livePieces[rng.IntN(len(livePieces))])
	}
	return b.String()
}

type liveChat struct {
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools,omitempty"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
}

func randomChat(rng *rand.Rand) liveChat {
	var msgs []map[string]any
	if rng.IntN(2) == 0 {
		msgs = append(msgs, map[string]any{"role": "system", "content": randomText(rng, 8)})
	}
	for i := range rng.IntN(5) + 1 {
		switch {
		case i%2 == 0:
			msgs = append(msgs, map[string]any{"role": "user", "content": randomText(rng, 12)})
		case rng.IntN(3) == 0:
			msgs = append(msgs,
				map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"id": "abcdefgh1", "type": "function",
					"function": map[string]any{"name": "get_weather", "arguments": map[string]any{"city": randomText(rng, 3), "days": rng.IntN(9)}}}}},
				map[string]any{"role": "tool", "tool_call_id": "abcdefgh1", "content": randomText(rng, 6)},
				map[string]any{"role": "assistant", "content": randomText(rng, 6)})
		default:
			msgs = append(msgs, map[string]any{"role": "assistant", "content": randomText(rng, 12)})
		}
	}
	raw, _ := json.Marshal(msgs)
	c := liveChat{Messages: raw, AddGenerationPrompt: rng.IntN(2) == 0}
	if rng.IntN(2) == 0 {
		c.Tools = json.RawMessage(`[{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]`)
	}
	return c
}

// TestLiveReference compares Encode and EncodeChat with the Python
// reference on a corpus drawn at random (see testSeed for the seed).
func TestLiveReference(t *testing.T) {
	py := referencePython(t)
	seed := testSeed(t, 1795507350192346719)
	rng := rand.New(rand.NewPCG(seed, 17))
	var texts []string
	for range 150 {
		texts = append(texts, randomText(rng, 40))
	}
	var chats []liveChat
	for range 25 {
		chats = append(chats, randomChat(rng))
	}
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			dir, err := filepath.Abs(filepath.Join("testdata", fam))
			if err != nil {
				t.Fatal(err)
			}
			var ref struct {
				Texts []goldenText `json:"texts"`
				Chats []rawChat    `json:"chats"`
			}
			runReference(t, py, "ref", map[string]any{"dir": dir, "texts": texts, "chats": chats}, &ref)
			m, err := tokenizer.LoadModel(dir, tokenizer.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range ref.Texts {
				if got := m.Tokenizer.Encode(nil, g.Text, false); !slices.Equal(got, g.IDs) {
					t.Errorf("Encode(%q) =\n %v, want\n %v", g.Text, got, g.IDs)
				}
				if got := m.Tokenizer.Encode(nil, g.Text, true); !slices.Equal(got, g.IDsSpecial) {
					t.Errorf("Encode(%q, special) =\n %v, want\n %v", g.Text, got, g.IDsSpecial)
				}
				if got := m.Tokenizer.Decode(g.IDsSpecial, true); got != g.Decoded {
					t.Errorf("Decode(%v) = %q, want %q", g.IDsSpecial, got, g.Decoded)
				}
			}
			for i := range ref.Chats {
				checkChat(t, m, &ref.Chats[i])
			}
		})
	}
}
