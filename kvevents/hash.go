package kvevents

import (
	"encoding/binary"
	"encoding/hex"
	"strconv"

	"github.com/kvroute/kvroute"
)

// HashKind says how an engine sent a block hash on the wire.
type HashKind uint8

// The wire forms of a block hash.
const (
	// HashNone is the zero Hash: no hash (a nil parent).
	HashNone HashKind = iota
	// HashUint is a non-negative integer (vLLM's default, and SGLang's
	// non-negative hashes).
	HashUint
	// HashInt is a negative integer (SGLang hashes are signed 64-bit).
	HashInt
	// HashBytes is a byte string, such as vLLM's raw 32-byte SHA-256 digest
	// when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
	HashBytes
)

// Hash is an engine's opaque block hash as it arrived on the wire.
//
// Key is the 64-bit key the index stores as kvroute.ExternalHash:
//   - an unsigned integer is its own key;
//   - a negative integer is folded to uint64 by two's complement (as Dynamo
//     does for SGLang's signed hashes);
//   - a byte string is keyed by its last 8 bytes read big-endian (fewer
//     bytes are zero-extended on the left), which is
//     int.from_bytes(h, "big") & (2**64-1): exactly the integer vLLM sends
//     for the same digest when integer hashes are on, so both encodings of
//     one block get one key.
type Hash struct {
	// Kind is the wire form; HashNone means no hash.
	Kind HashKind
	// Key is the 64-bit key described on the type.
	Key uint64
	// Bytes is the byte string of a HashBytes hash. A decoded Hash aliases
	// the payload it was decoded from.
	Bytes []byte
}

// UintHash returns the Hash of a non-negative integer hash.
func UintHash(v uint64) Hash { return Hash{Kind: HashUint, Key: v} }

// IntHash returns the Hash of a signed integer hash: HashInt when v is
// negative, HashUint otherwise.
func IntHash(v int64) Hash {
	if v < 0 {
		return Hash{Kind: HashInt, Key: uint64(v)}
	}
	return Hash{Kind: HashUint, Key: uint64(v)}
}

// BytesHash returns the Hash of a byte-string hash. It keeps b.
func BytesHash(b []byte) Hash { return Hash{Kind: HashBytes, Key: BytesKey(b), Bytes: b} }

// BytesKey returns the 64-bit key of a byte-string hash: its last 8 bytes
// read big-endian, zero-extended when b is shorter.
func BytesKey(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var k uint64
	for _, c := range b {
		k = k<<8 | uint64(c)
	}
	return k
}

// Valid reports whether h holds a hash (its Kind is not HashNone).
func (h Hash) Valid() bool { return h.Kind != HashNone }

// External returns the key as the index's kvroute.ExternalHash.
func (h Hash) External() kvroute.ExternalHash { return kvroute.ExternalHash(h.Key) }

// Int returns the signed value of a HashInt hash (and the two's-complement
// reading of any other key).
func (h Hash) Int() int64 { return int64(h.Key) }

// String formats the hash as it was sent: a decimal integer or hex bytes.
func (h Hash) String() string {
	switch h.Kind {
	case HashUint:
		return strconv.FormatUint(h.Key, 10)
	case HashInt:
		return strconv.FormatInt(int64(h.Key), 10)
	case HashBytes:
		return hex.EncodeToString(h.Bytes)
	}
	return "nil"
}
