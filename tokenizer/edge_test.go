package tokenizer_test

import (
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
