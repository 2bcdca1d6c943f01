package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The regular expressions of the byte-level BPE families, recognised by
// their exact text and run by hand-written matchers (Go's regexp has no
// look-ahead, which \s+(?!\S) needs). Each matcher returns the end of the
// match that the Oniguruma engine used by Hugging Face tokenizers finds at
// position i; every position of every string starts a match.
const (
	// patternGPT2 is GPT-2's, used by the ByteLevel pre-tokenizer when
	// use_regex is set.
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// patternLlama3 is the cl100k pattern of Llama 3 and many others.
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternQwen2 is Qwen 2's: Llama 3's with one digit per piece.
	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// matcher returns the end of the match starting at i < len(s).
type matcher func(s string, i int) int

// knownPatterns maps each supported regular expression to its matcher.
var knownPatterns = map[string]matcher{
	patternGPT2:   matchGPT2,
	patternLlama3: func(s string, i int) int { return matchCL100K(s, i, 3) },
	patternQwen2:  func(s string, i int) int { return matchCL100K(s, i, 1) },
}

func decode(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// Character classes of ASCII, looked up before the Unicode tables.
const (
	classL = 1 << iota
	classN
	classS
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for r := range rune(utf8.RuneSelf) {
		switch {
		case unicode.IsLetter(r):
			t[r] = classL
		case unicode.IsNumber(r):
			t[r] = classN
		case unicode.IsSpace(r):
			t[r] = classS
		}
	}
	return t
}()

// isL reports \p{L} as the reference's Unicode tables class it.
func isL(r rune) bool {
	if uint32(r) < utf8.RuneSelf {
		return asciiClass[r] == classL
	}
	return r >= 0 && (unicode.IsLetter(r) || inRanges(newerLetters, r))
}

// isN reports \p{N} as the reference's Unicode tables class it.
func isN(r rune) bool {
	if uint32(r) < utf8.RuneSelf {
		return asciiClass[r] == classN
	}
	return r >= 0 && (unicode.IsNumber(r) || inRanges(newerNumbers, r))
}

func isS(r rune) bool {
	if uint32(r) < utf8.RuneSelf {
		return asciiClass[r] == classS
	}
	return r >= 0 && unicode.IsSpace(r)
}

// isOther reports [^\s\p{L}\p{N}].
func isOther(r rune) bool {
	if uint32(r) < utf8.RuneSelf {
		return asciiClass[r] == 0
	}
	return r >= 0 && !unicode.IsSpace(r) && !isL(r) && !isN(r)
}

// run returns the end of the run of runes satisfying f from i.
func run(s string, i int, f func(rune) bool) int {
	for i < len(s) {
		r, n := decode(s, i)
		if !f(r) {
			break
		}
		i += n
	}
	return i
}

// contraction matches 's 't 're 've 'm 'll 'd at i, case-insensitively
// when fold is set, and returns its end or -1.
func contraction(s string, i int, fold bool) int {
	if s[i] != '\'' || i+1 >= len(s) {
		return -1
	}
	lower := func(c byte) byte {
		if fold && 'A' <= c && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		if i+2 < len(s) && lower(s[i+2]) == 'e' {
			return i + 3
		}
	case 'l':
		if i+2 < len(s) && lower(s[i+2]) == 'l' {
			return i + 3
		}
	}
	return -1
}

// spaces matches \s+(?!\S)|\s+ at a white-space rune i.
func spaces(s string, i int) int {
	end := run(s, i, isS)
	if end == len(s) {
		return end
	}
	// Give back the last white-space rune, so that it starts the next
	// piece, unless the run is a single rune.
	_, last := utf8.DecodeLastRuneInString(s[i:end])
	if end-last > i {
		return end - last
	}
	return end
}

func matchGPT2(s string, i int) int {
	if e := contraction(s, i, false); e >= 0 {
		return e
	}
	r0, n0 := decode(s, i)
	j := i
	r := r0
	if r0 == ' ' {
		if r1, _ := decode(s, i+n0); isL(r1) || isN(r1) || isOther(r1) {
			j, r = i+n0, r1
		}
	}
	switch {
	case isL(r):
		return run(s, j, isL)
	case isN(r):
		return run(s, j, isN)
	case isOther(r):
		return run(s, j, isOther)
	}
	return spaces(s, i)
}

// matchCL100K matches the Llama 3 pattern (digits = 3) or Qwen 2's
// (digits = 1).
func matchCL100K(s string, i int, digits int) int {
	if e := contraction(s, i, true); e >= 0 {
		return e
	}
	r0, n0 := decode(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isL(r0) {
		return run(s, i, isL)
	}
	if r0 != '\r' && r0 != '\n' && !isN(r0) {
		if r1, _ := decode(s, i+n0); isL(r1) {
			return run(s, i+n0, isL)
		}
	}
	// \p{N}{1,digits}
	if isN(r0) {
		j := i
		for k := 0; k < digits && j < len(s); k++ {
			r, n := decode(s, j)
			if !isN(r) {
				break
			}
			j += n
		}
		return j
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	j := i
	if r0 == ' ' {
		j += n0
	}
	if r, _ := decode(s, j); isOther(r) {
		j = run(s, j, isOther)
		return run(s, j, func(r rune) bool { return r == '\r' || r == '\n' })
	}
	// \s*[\r\n]+ : the white space up to its last line break.
	end := run(s, i, isS)
	if k := lastLineBreak(s[i:end]); k >= 0 {
		return i + k + 1
	}
	return spaces(s, i)
}

func lastLineBreak(w string) int {
	for k := len(w) - 1; k >= 0; k-- {
		if w[k] == '\r' || w[k] == '\n' {
			return k
		}
	}
	return -1
}
