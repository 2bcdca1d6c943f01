package tokenizer

import (
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

// BenchmarkNormalizeLead normalizes a long text that is not in normal form
// (decomposed accents throughout) while following its lead, as the first
// piece of a prompt is under a Metaspace "first" pre-tokenizer.
func BenchmarkNormalizeLead(b *testing.B) {
	text := strings.Repeat("Caf\u0065\u0301 na\u0069\u0308ve r\u00e9sum\u00e9 \ufb01ne ", 200)
	for _, f := range []struct {
		name string
		form norm.Form
	}{{"NFC", norm.NFC}, {"NFKC", norm.NFKC}, {"NFD", norm.NFD}} {
		b.Run(f.name, func(b *testing.B) {
			n := unicodeNorm{f.form}
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				n.normalizeLead(text, 1)
			}
		})
	}
}
