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
func unknownToRef(r rune) bool {
	if r < unknownToReference[0][0] {
		return false
	}
	i := sort.Search(len(unknownToReference), func(i int) bool { return unknownToReference[i][1] >= r })
	return i < len(unknownToReference) && unknownToReference[i][0] <= r
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
