package tokenizer_test

import (
	"encoding/json"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

// leadVariants is testdata/mistral/lead_variants.json, written by
// `reference.py variants`: normalizers and pre-tokenizers replacing the
// mistral fixture's, texts, and the ids tokenizers gives each text under
// each variant.
type leadVariants struct {
	Tokenizer string                       `json:"tokenizer"`
	Variants  []map[string]json.RawMessage `json:"variants"`
	Texts     []string                     `json:"texts"`
	IDs       [][][]uint32                 `json:"ids"`
}

// variantTokenizer is the mistral fixture with v's components in place of
// its own.
func variantTokenizer(t *testing.T, v map[string]json.RawMessage) *tokenizer.Tokenizer {
	t.Helper()
	var file map[string]json.RawMessage
	if err := json.Unmarshal(readFile(t, filepath.Join("testdata", "mistral", "tokenizer.json")), &file); err != nil {
		t.Fatal(err)
	}
	for k, raw := range v {
		file[k] = raw
	}
	b, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(b)
	if err != nil {
		t.Fatalf("variant %s: %v", v, err)
	}
	return tok
}

func checkLeadVariants(t *testing.T, g *leadVariants) {
	t.Helper()
	for i, v := range g.Variants {
		tok := variantTokenizer(t, v)
		for j, text := range g.Texts {
			if got := tok.Encode(nil, text, false); !slices.Equal(got, g.IDs[i][j]) {
				t.Errorf("variant %d: Encode(%q) = %v, want %v", i, text, got, g.IDs[i][j])
			}
		}
	}
}

// TestMetaspaceFirstAfterNormalizer: Metaspace's "first" prepend scheme
// prepends to a piece whose normalized text Hugging Face still aligns with
// the start of the original text, so a Strip normalizer that removes
// leading white space (or a Replace that removes or rewrites the first
// characters) stops the prepending, and text a normalizer inserts at the
// start keeps it, as tokenizers does.
func TestMetaspaceFirstAfterNormalizer(t *testing.T) {
	var g leadVariants
	if err := json.Unmarshal(readFile(t, filepath.Join("testdata", "mistral", "lead_variants.json")), &g); err != nil {
		t.Fatal(err)
	}
	if len(g.IDs) != len(g.Variants) {
		t.Fatalf("%d id lists for %d variants", len(g.IDs), len(g.Variants))
	}
	checkLeadVariants(t, &g)
}

// TestMetaspaceFirstAfterNormalizerLive checks the variants of
// TestMetaspaceFirstAfterNormalizer against the Python reference on the
// golden texts and random ones (see testSeed for the seed).
func TestMetaspaceFirstAfterNormalizerLive(t *testing.T) {
	py := referencePython(t)
	var g leadVariants
	if err := json.Unmarshal(readFile(t, filepath.Join("testdata", "mistral", "lead_variants.json")), &g); err != nil {
		t.Fatal(err)
	}
	seed := testSeed(t, 1795507357632631493)
	rng := rand.New(rand.NewPCG(seed, 23))
	for range 100 {
		g.Texts = append(g.Texts, randomText(rng, 12))
	}
	var ref leadVariants
	runReference(t, py, "variants", map[string]any{"tokenizer": filepath.Join("testdata", "mistral", "tokenizer.json"), "variants": g.Variants, "texts": g.Texts}, &ref)
	checkLeadVariants(t, &ref)
}
