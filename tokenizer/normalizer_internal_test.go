package tokenizer

import (
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

// TestUnicodeNormLongMarkRuns checks runs of more than 30 combining marks,
// which Hugging Face normalizes whole (no U+034F inserted, every mark put
// in canonical order and composed when it can be), and characters newer
// than Hugging Face's Unicode tables, which it leaves whole as starters.
func TestUnicodeNormLongMarkRuns(t *testing.T) {
	acute := strings.Repeat("\u0301", 40)
	tests := []struct {
		form     norm.Form
		in, want string
	}{
		{norm.NFC, "e" + acute, "\u00e9" + acute[2:]},
		{norm.NFKC, "x" + acute, "x" + acute},
		{norm.NFC, "c" + acute + "\u0327", "\u1e09" + acute[2:]},
		{norm.NFD, "c" + acute + "\u0327", "c\u0327" + acute},
		{norm.NFD, "\u00e9" + acute, "e\u0301" + acute},
		{norm.NFKD, "\ufb01" + acute + "a", "fi" + acute + "a"},
		{norm.NFC, acute + "a\u0308", acute + "\u00e4"},
		{norm.NFC, "\u1100\u1161" + acute + "\u11a8", "\uac00" + acute + "\u11a8"},
		{norm.NFKC, "a\U0001E030b\U0001FBF0", "a\U0001E030b\U0001FBF0"},
		{norm.NFKD, "\U0001E030\u00e9", "\U0001E030e\u0301"},
		{norm.NFC, "a\u1abf\u0301", "a\u1abf\u0301"},
		{norm.NFC, "a\u0301\u1abf", "\u00e1\u1abf"},
		{norm.NFKC, strings.Repeat("\u0327\u0301", 20) + "\u034f", strings.Repeat("\u0327", 20) + acute[:40] + "\u034f"},
		// x/text's norm.Iter panics on these (a nil flusher).
		{norm.NFD, "a\uff9e\u0308\uff9e", "a\uff9e\u0308\uff9e"},
		{norm.NFD, "caf\u00e97\uff9e\u0308\uff9e sp", "cafe\u03017\uff9e\u0308\uff9e sp"},
	}
	for _, tt := range tests {
		n := unicodeNorm{tt.form}
		if got := n.normalize(tt.in); got != tt.want {
			t.Errorf("%v: normalize(%+q) = %+q, want %+q", tt.form, tt.in, got, tt.want)
		}
		if got, _ := n.normalizeLead(tt.in, firstRuneLen(tt.in)); got != tt.want {
			t.Errorf("%v: normalizeLead(%+q) = %+q, want %+q", tt.form, tt.in, got, tt.want)
		}
	}
}

// TestNewerCharacterClassesKnown: characters of Unicode 16, which Go's tables
// do not class yet, are letters and numbers to the pre-tokenizers'
// regular expressions as they are to Hugging Face's.
func TestNewerCharacterClassesKnown(t *testing.T) {
	for _, tt := range []struct {
		r          rune
		letter, nb bool
	}{
		{0x105C0, true, false},  // TODHRI LETTER A
		{0x13460, true, false},  // EGYPTIAN HIEROGLYPH-13460
		{0x10D40, false, true},  // GARAY DIGIT ZERO
		{0x1CCF0, false, true},  // OUTLINED DIGIT ZERO
		{0x1F600, false, false}, // an emoji
		{0x4E00, true, false},   // a CJK ideograph
	} {
		if isL(tt.r) != tt.letter || isN(tt.r) != tt.nb || isOther(tt.r) != (!tt.letter && !tt.nb) {
			t.Errorf("U+%04X: letter %v, number %v, other %v", tt.r, isL(tt.r), isN(tt.r), isOther(tt.r))
		}
	}
}
