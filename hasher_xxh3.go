package kvroute

import (
	"math/bits"
	"unsafe"
)

// The block hash of a 16-token block (64 bytes, the block size of vLLM,
// SGLang and Dynamo by default) is XXH3-64's 17-to-128-byte path, written
// out here for exactly 64 bytes with the seed folded into the secret words
// once per call, so that the hashing loops make one small call per block
// (no length switch, no per-block keying) and overlap each block's
// multiplies with the chaining of the previous one.
// Other windows go through github.com/zeebo/xxh3. TestHasher16MatchesReference
// and FuzzHasherMatchesReference check it against that package; it makes
// chained hashing of 16-token blocks about a fifth cheaper (BenchmarkHash).

// window64 is the only window, in bytes, hashed by hash64.
const window64 = 64

// keys64 holds the eight words of XXH3's default secret that a 64-byte
// input reads, already combined with a seed (even words plus it, odd
// words minus it).
type keys64 [8]uint64

// xxh3Secret64 are the first eight words of XXH3's default secret.
var xxh3Secret64 = keys64{
	0xbe4ba423396cfeb8, 0x1cad21f72c81017c, 0xdb979083e96dd4de, 0x1f67b3b7a4a44072,
	0x78e5c0cc4ee679cb, 0x2172ffcc7dd05a82, 0x8e2443f7744608b8, 0x4c263a81e69035e0,
}

// seededKeys64 returns XXH3's secret words for a 64-byte input keyed with
// seed.
func seededKeys64(seed uint64) keys64 {
	k := xxh3Secret64
	for i := 0; i < len(k); i += 2 {
		k[i] += seed
		k[i+1] -= seed
	}
	return k
}

// hash64 is XXH3-64 of the 64 bytes at p under the seed k was keyed with.
// The bytes are read in native order, so callers use it only on
// little-endian machines.
func hash64(p unsafe.Pointer, k *keys64) uint64 {
	const lenTimesPrime1 = 0x8dde6c617af2a1c0 // 64 · XXH3's PRIME64_1, mod 2⁶⁴
	h0, l0 := bits.Mul64(word(p, 0)^k[0], word(p, 8)^k[1])
	h1, l1 := bits.Mul64(word(p, 48)^k[2], word(p, 56)^k[3])
	h2, l2 := bits.Mul64(word(p, 16)^k[4], word(p, 24)^k[5])
	h3, l3 := bits.Mul64(word(p, 32)^k[6], word(p, 40)^k[7])
	acc := lenTimesPrime1 + (h0 ^ l0) + (h1 ^ l1) + (h2 ^ l2) + (h3 ^ l3)
	acc ^= acc >> 37
	acc *= 0x165667919e3779f9
	return acc ^ acc>>32
}

// word reads the native-order uint64 at byte offset off from p.
func word(p unsafe.Pointer, off uintptr) uint64 {
	return *(*uint64)(unsafe.Add(p, off))
}

// fast64 reports whether h's blocks are 64-byte windows at a 64-byte stride
// (16 tokens, no Eagle) that hash64 can hash in place.
func (h Hasher) fast64() bool {
	return littleEndian && h.window == window64 && h.blockSize*4 == window64
}
