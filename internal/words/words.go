// Package words is a deterministic tokenizer for tests and demonstrations:
// one token per run of non-space characters, its id the run's 32-bit
// FNV-1a hash, and a token per chat role. Its ids match no real model.
package words

import (
	"unicode"
	"unicode/utf8"
)

const (
	fnvOffset = 2166136261
	fnvPrime  = 16777619
)

func fnvAdd(h uint32, s string) uint32 {
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= fnvPrime
	}
	return h
}

// Role returns the token of "<|role|>".
func Role(role string) uint32 {
	h := fnvAdd(fnvOffset, "<|")
	h = fnvAdd(h, role)
	return fnvAdd(h, "|>")
}

// Append appends the token of every run of non-space characters of s.
func Append(dst []uint32, s string) []uint32 {
	start := -1
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if unicode.IsSpace(r) {
			if start >= 0 {
				dst = append(dst, fnvAdd(fnvOffset, s[start:i]))
				start = -1
			}
		} else if start < 0 {
			start = i
		}
		i += n
	}
	if start >= 0 {
		dst = append(dst, fnvAdd(fnvOffset, s[start:]))
	}
	return dst
}
