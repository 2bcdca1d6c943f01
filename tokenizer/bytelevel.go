package tokenizer

import "strings"

// byteChars is GPT-2's byte-to-character table: printable bytes stand for
// themselves, the others for the characters from U+0100 on, in order.
var byteChars, charBytes = func() ([256]string, map[rune]byte) {
	var chars [256]string
	back := make(map[rune]byte, 256)
	n := 0
	for b := range 256 {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF) {
			r = rune(256 + n)
			n++
		}
		chars[b] = string(r)
		back[r] = byte(b)
	}
	return chars, back
}()

// mapBytes writes s in the byte-level alphabet.
func mapBytes(s string) string {
	var b strings.Builder
	b.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		b.WriteString(byteChars[s[i]])
	}
	return b.String()
}

// unmapBytes returns the bytes a byte-level token stands for, and false
// when it has a character outside the alphabet.
func unmapBytes(tok string) (string, bool) {
	var b strings.Builder
	b.Grow(len(tok))
	for _, r := range tok {
		c, ok := charBytes[r]
		if !ok {
			return "", false
		}
		b.WriteByte(c)
	}
	return b.String(), true
}
