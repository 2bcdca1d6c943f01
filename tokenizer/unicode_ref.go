package tokenizer

import (
	"sort"
	"unicode/utf8"
)

// unknownToReference lists, as sorted inclusive ranges, the characters
// that Go's Unicode tables (x/text) decompose or give a non-zero combining
// class but the normalizers of Hugging Face tokenizers (the Rust crate
// unicode-normalization-alignments, on older Unicode tables) do not know:
// there they are left as they are and act as starters. Characters added
// to Unicode since then, such as U+1E030 MODIFIER LETTER CYRILLIC SMALL A
// (NFKC: а) or U+1FBF0 SEGMENTED DIGIT ZERO (NFKC: 0). Checked against the
// reference by TestUnknownToReferenceTable.
var unknownToReference = [][2]rune{
	{0x7FD, 0x7FD}, {0x898, 0x89F}, {0x8CA, 0x8D3}, {0x9FE, 0x9FE}, {0xC3C, 0xC3C}, {0xD3B, 0xD3C},
	{0xEBA, 0xEBA}, {0x1715, 0x1715}, {0x1ABF, 0x1ACE}, {0x1DF6, 0x1DFA}, {0x32FF, 0x32FF}, {0xA7F2, 0xA7F4},
	{0xA82C, 0xA82C}, {0xAB69, 0xAB69}, {0x10781, 0x10785}, {0x10787, 0x107B0}, {0x107B2, 0x107BA},
	{0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85},
	{0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A}, {0x11938, 0x11938},
	{0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47},
	{0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45}, {0x11D97, 0x11D97}, {0x11F41, 0x11F42},
	{0x16FF0, 0x16FF1}, {0x1E030, 0x1E06D}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE},
	{0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF}, {0x1F16C, 0x1F16C}, {0x1FBF0, 0x1FBF9},
}

// unknownToRef reports whether r is in unknownToReference.
func unknownToRef(r rune) bool { return inRanges(unknownToReference, r) }

// newerLetters and newerNumbers list, as sorted inclusive ranges, the
// characters that the regular expressions of Hugging Face tokenizers
// (Oniguruma, on newer Unicode tables than Go's) match with \p{L} and
// \p{N} but Go's unicode package does not class as letters or numbers:
// characters added in Unicode 16, such as the Todhri and Garay scripts and
// Egyptian hieroglyphs extended-A. Checked against the reference by
// TestNewerCharacterClasses.
var (
	newerLetters = [][2]rune{
		{0x1C89, 0x1C8A}, {0xA7CB, 0xA7CD}, {0xA7DA, 0xA7DC}, {0x105C0, 0x105F3}, {0x10D4A, 0x10D65},
		{0x10D6F, 0x10D85}, {0x10EC2, 0x10EC4}, {0x11380, 0x11389}, {0x1138B, 0x1138B}, {0x1138E, 0x1138E},
		{0x11390, 0x113B5}, {0x113B7, 0x113B7}, {0x113D1, 0x113D1}, {0x113D3, 0x113D3}, {0x11BC0, 0x11BE0},
		{0x13460, 0x143FA}, {0x16100, 0x1611D}, {0x16D40, 0x16D6C}, {0x18CFF, 0x18CFF}, {0x1E5D0, 0x1E5ED},
		{0x1E5F0, 0x1E5F0}, {0x2EBF0, 0x2EE5D},
	}
	newerNumbers = [][2]rune{
		{0x10D40, 0x10D49}, {0x116D0, 0x116E3}, {0x11BF0, 0x11BF9}, {0x16130, 0x16139}, {0x16D70, 0x16D79},
		{0x1CCF0, 0x1CCF9}, {0x1E5F1, 0x1E5FA},
	}
)

// inRanges reports whether r is in one of the sorted inclusive ranges.
func inRanges(ranges [][2]rune, r rune) bool {
	if r < ranges[0][0] || r > ranges[len(ranges)-1][1] {
		return false
	}
	i := sort.Search(len(ranges), func(i int) bool { return ranges[i][1] >= r })
	return i < len(ranges) && ranges[i][0] <= r
}

// hasUnknownToRef reports whether s holds a character of
// unknownToReference. The first, U+07FD, is the lowest to check, so bytes
// below its lead byte 0xDF are skipped without decoding.
func hasUnknownToRef(s string) bool {
	for i := 0; i < len(s); {
		if s[i] < 0xDF {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if unknownToRef(r) {
			return true
		}
		i += n
	}
	return false
}
