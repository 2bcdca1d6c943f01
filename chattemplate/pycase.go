package chattemplate

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

// Python's str methods map case with the full mappings of Unicode's
// SpecialCasing ('ß'.upper() is 'SS', 'ﬁ'.upper() 'FI', 'İ'.lower()
// 'i̇') and lower-case a capital sigma that ends a word as 'ς'; Go's
// strings.ToUpper and ToLower map one character to one. The language-
// independent casers of golang.org/x/text/cases map as Python does.

// pyUpper is str.upper.
func pyUpper(s string) string {
	if isASCII(s) {
		return strings.ToUpper(s)
	}
	return cases.Upper(language.Und).String(s)
}

// pyLower is str.lower.
func pyLower(s string) string {
	switch {
	case isASCII(s):
		return strings.ToLower(s)
	case !strings.ContainsRune(s, capitalSigma):
		return cases.Lower(language.Und).String(s)
	}
	var b strings.Builder
	b.Grow(len(s))
	writeLower(&b, newRuneCaser(cases.Lower(language.Und)), s, 0)
	return b.String()
}

// isASCII reports whether s is ASCII, whose case Go's strings package
// maps as Python does.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// runeCaser maps one character at a time with a caser, without
// allocating.
type runeCaser struct {
	c   cases.Caser
	src [utf8.UTFMax]byte
	dst [32]byte // a character's full mapping is at most three characters
}

func newRuneCaser(c cases.Caser) *runeCaser { return &runeCaser{c: c} }

// write writes r mapped to b.
func (rc *runeCaser) write(b *strings.Builder, r rune) {
	n := utf8.EncodeRune(rc.src[:], r)
	rc.c.Reset()
	m, _, err := rc.c.Transform(rc.dst[:], rc.src[:n], true)
	if err != nil { // not for one character into 32 bytes
		b.WriteRune(r)
		return
	}
	b.Write(rc.dst[:m])
}

// writeLower writes s[from:] lower-cased by lower, as str.lower
// lower-cases it within s: a capital sigma by the characters around it in
// s (x/text's caser takes a cased case-ignorable character, such as
// U+2095, for the cased character before a final sigma, which Python
// skips).
func writeLower(b *strings.Builder, lower *runeCaser, s string, from int) {
	for i, r := range s[from:] {
		switch {
		case r < utf8.RuneSelf:
			b.WriteByte(byte(unicode.ToLower(r)))
		case r == capitalSigma:
			b.WriteRune(sigmaAt(s, from+i))
		default:
			lower.write(b, r)
		}
	}
}

// pyCapitalize is str.capitalize: the first character title-cased, the
// others lower-cased.
func pyCapitalize(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	newRuneCaser(cases.Title(language.Und)).write(&b, r)
	writeLower(&b, newRuneCaser(cases.Lower(language.Und)), s, n)
	return b.String()
}

// pyTitle is str.title: a cased character after an uncased one starts a
// word and is title-cased; the other cased characters are lower-cased,
// a capital sigma as str.lower would in the whole string.
func pyTitle(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	title, lower := newRuneCaser(cases.Title(language.Und)), newRuneCaser(cases.Lower(language.Und))
	prevCased := false
	for i, r := range s {
		switch {
		case r < utf8.RuneSelf && !prevCased:
			b.WriteByte(byte(unicode.ToUpper(r)))
		case r < utf8.RuneSelf:
			b.WriteByte(byte(unicode.ToLower(r)))
		case !prevCased:
			title.write(&b, r)
		case r == capitalSigma:
			b.WriteRune(sigmaAt(s, i))
		default:
			lower.write(&b, r)
		}
		prevCased = isCased(r)
	}
	return b.String()
}

// jinjaTitle is Jinja's title filter: the text split before and after
// runs of white space and -({[<, each part's first character upper-cased
// and the rest of the part lower-cased, as str.upper and str.lower do.
func jinjaTitle(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	upper, lower := newRuneCaser(cases.Upper(language.Und)), newRuneCaser(cases.Lower(language.Und))
	sep := func(r rune) bool { return pyIsSpace(r) || strings.ContainsRune("-({[<", r) }
	for s != "" {
		r, n := utf8.DecodeRuneInString(s)
		end := strings.IndexFunc(s[n:], func(x rune) bool { return sep(x) != sep(r) })
		if end < 0 {
			end = len(s)
		} else {
			end += n
		}
		if r < utf8.RuneSelf {
			b.WriteByte(byte(unicode.ToUpper(r)))
		} else {
			upper.write(&b, r)
		}
		// Jinja lower-cases item[1:], a string of its own: a capital
		// sigma is final or not within it.
		writeLower(&b, lower, s[n:end], 0)
		s = s[end:]
	}
	return b.String()
}

const (
	capitalSigma = 'Σ'
	finalSigma   = 'ς'
	smallSigma   = 'σ'
)

// sigmaAt is the lower case of the capital sigma at byte i of s, as
// CPython's handle_capital_sigma has it: final when a cased character
// comes before it and none after it, case-ignorable characters between
// skipped.
func sigmaAt(s string, i int) rune {
	before := strings.TrimRightFunc(s[:i], isCaseIgnorable)
	prev, n := utf8.DecodeLastRuneInString(before)
	if n == 0 || !isCased(prev) {
		return smallSigma
	}
	after := strings.TrimLeftFunc(s[i+utf8.RuneLen(capitalSigma):], isCaseIgnorable)
	if next, n := utf8.DecodeRuneInString(after); n > 0 && isCased(next) {
		return smallSigma
	}
	return finalSigma
}

// isCased reports whether r has Unicode's Cased property: lower-case,
// upper-case or title-case.
func isCased(r rune) bool { return isLowercase(r) || isUppercase(r) || unicode.IsTitle(r) }

// isCaseIgnorable reports whether r has Unicode's Case_Ignorable
// property: a mark, format character, modifier, or a character that may
// sit inside a word (Word_Break MidLetter, MidNumLet or Single_Quote).
func isCaseIgnorable(r rune) bool {
	switch r {
	case '\'', '.', ':', '\u00b7', '\u0387', '\u055f', '\u05f4', '\u2018', '\u2019', '\u2024',
		'\u2027', '\ufe13', '\ufe52', '\ufe55', '\uff07', '\uff0e', '\uff1a':
		return true
	}
	return unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf, unicode.Lm, unicode.Sk)
}

// pyIsLower is str.islower: some character is lower-case and none is
// upper- or title-case.
func pyIsLower(s string) bool {
	lower := false
	for _, r := range s {
		switch {
		case isUppercase(r) || unicode.IsTitle(r):
			return false
		case isLowercase(r):
			lower = true
		}
	}
	return lower
}

// pyIsUpper is str.isupper: some character is upper-case and none is
// lower- or title-case.
func pyIsUpper(s string) bool {
	upper := false
	for _, r := range s {
		switch {
		case isLowercase(r) || unicode.IsTitle(r):
			return false
		case isUppercase(r):
			upper = true
		}
	}
	return upper
}

// isLowercase and isUppercase are Unicode's Lowercase and Uppercase
// properties.
func isLowercase(r rune) bool { return unicode.IsLower(r) || unicode.Is(unicode.Other_Lowercase, r) }
func isUppercase(r rune) bool { return unicode.IsUpper(r) || unicode.Is(unicode.Other_Uppercase, r) }

// pyIsSpace is str.isspace for one character: Go's white space and the
// separators U+001C to U+001F, which Python counts as white space too.
func pyIsSpace(r rune) bool { return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f }
