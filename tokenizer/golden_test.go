package tokenizer_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

// families are the model directories under testdata, written by
// testdata/reference.py gen testdata.
var families = []string{"gpt2", "llama3", "qwen2", "mistral", "unigram"}

type goldenText struct {
	Text       string   `json:"text"`
	IDs        []uint32 `json:"ids"`
	IDsSpecial []uint32 `json:"ids_special"`
	Decoded    string   `json:"decoded"`
}

type goldenChat struct {
	Messages            []any          `json:"messages"`
	Tools               []any          `json:"tools"`
	AddGenerationPrompt bool           `json:"add_generation_prompt"`
	Kwargs              map[string]any `json:"kwargs"`
	Text                string         `json:"text"`
	IDs                 []uint32       `json:"ids"`
	Error               string         `json:"error"`
}

type golden struct {
	Texts []goldenText `json:"texts"`
	Chats []goldenChat `json:"chats"`
}

func readGolden(t testing.TB, family string) golden {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", family, "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestEncodeGolden checks Encode against the ids of the tokenizers
// library, with and without the post-processor's special tokens.
func TestEncodeGolden(t *testing.T) {
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			tok, err := tokenizer.FromFile(filepath.Join("testdata", fam, "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range readGolden(t, fam).Texts {
				if got := tok.Encode(nil, g.Text, false); !slices.Equal(got, g.IDs) {
					t.Errorf("Encode(%q) =\n %v, want\n %v", g.Text, got, g.IDs)
				}
				if got := tok.Encode(nil, g.Text, true); !slices.Equal(got, g.IDsSpecial) {
					t.Errorf("Encode(%q, special) =\n %v, want\n %v", g.Text, got, g.IDsSpecial)
				}
			}
		})
	}
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
