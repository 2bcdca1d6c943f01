package kvroute

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// BlockHash is the content hash of one full block of token ids, independent
// of what precedes it (Dynamo's LocalBlockHash).
type BlockHash uint64

// SeqHash is the chained hash of a block and every block before it (Dynamo's
// SequenceHash): equal SeqHash values name equal token prefixes.
type SeqHash uint64

// ExternalHash is the opaque block hash an engine puts in its KV events. The
// index never interprets it: it only uses it to find a block a later event
// refers to (a parent or a removed block). Engines that send byte-string
// hashes are mapped to 64 bits by package kvevents.
type ExternalHash uint64

// HashSeed is the XXH3-64 seed of Dynamo's router (XXH3_SEED). Block hashes
// use it plus the LoRA and namespace offsets; chaining always uses it as is.
const HashSeed uint64 = 1337

// DefaultBlockSize is the block size a zero HasherConfig gets: vLLM's default.
const DefaultBlockSize = 16

// MaxBlockSize bounds HasherConfig.BlockSize.
const MaxBlockSize = 1 << 16

// ErrBlockSize is returned by NewHasher for a block size out of range.
var ErrBlockSize = errors.New("kvroute: block size out of range")

// HasherConfig configures a Hasher. The zero value hashes blocks of 16 tokens
// with no LoRA adapter and no namespace.
type HasherConfig struct {
	// BlockSize is the number of tokens per KV block; it must match the
	// engines'. Zero means DefaultBlockSize.
	BlockSize int
	// LoRA is the LoRA adapter name, empty for the base model. A non-empty
	// name adds XXH3-64(name, seed 0) to the seed (wrapping), as Dynamo does,
	// so that adapters never share cache entries with the base model.
	LoRA string
	// Namespace isolates caches that must never match each other (tenants,
	// model revisions). A non-empty namespace adds XXH3-64(ns, seed 1) to
	// the seed, as Dynamo's cache_namespace does. Empty means no namespace.
	// Per-request cache salts extend it (see WithSalt).
	Namespace string
	// Eagle hashes each block together with the first token of the next
	// block, as engines running Eagle speculative decoding store them
	// (SGLang's bigram pages, Dynamo's is_eagle): block i covers the
	// BlockSize+1 tokens from i*BlockSize, so n tokens make (n-1)/BlockSize
	// blocks.
	Eagle bool
}

// Hasher turns token ids into block and sequence hashes, bit-identical to
// NVIDIA Dynamo's router: each full block is hashed with XXH3-64 over its
// token ids as little-endian uint32 values; a partial last block is not
// hashed; the first sequence hash equals the first block hash and
// seq[i] = XXH3-64(le64(seq[i-1]) ‖ le64(block[i]), HashSeed).
//
// A Hasher is a small immutable value: copy it freely and use it from any
// number of goroutines. The zero Hasher is not valid; use NewHasher.
type Hasher struct {
	blockSize int
	window    int    // bytes hashed per block: 4*blockSize, plus 4 with Eagle
	baseSeed  uint64 // HashSeed plus the namespace offset
	seed      uint64 // baseSeed plus the LoRA offset
	// namespace and salt are what baseSeed was made from: the namespace
	// alone, or SaltedNamespace(namespace, salt) when salt is set (only
	// under a non-empty namespace, so that salting allocates no string).
	namespace, salt string
}

// NewHasher returns a Hasher for cfg. It returns ErrBlockSize when the
// block size is negative or larger than MaxBlockSize.
func NewHasher(cfg HasherConfig) (Hasher, error) {
	bs := cfg.BlockSize
	if bs == 0 {
		bs = DefaultBlockSize
	}
	if bs < 0 || bs > MaxBlockSize {
		return Hasher{}, fmt.Errorf("%w: %d", ErrBlockSize, cfg.BlockSize)
	}
	window := bs * 4
	if cfg.Eagle {
		window += 4
	}
	base := namespaceSeed(cfg.Namespace)
	h := Hasher{blockSize: bs, window: window, baseSeed: base, seed: base, namespace: cfg.Namespace}
	return h.WithLoRA(cfg.LoRA), nil
}

// namespaceSeed is HashSeed plus the offset of a namespace.
func namespaceSeed(ns string) uint64 {
	if ns == "" {
		return HashSeed
	}
	return HashSeed + xxh3.HashStringSeed(ns, 1)
}

// maxStackSaltedNamespace bounds the salted namespaces saltedSeed builds on
// the stack; longer ones allocate.
const maxStackSaltedNamespace = 256

// saltedSeed is namespaceSeed(SaltedNamespace(ns, salt)) for a non-empty
// namespace and salt, without building the string on the heap.
func saltedSeed(ns, salt string) uint64 {
	var buf [maxStackSaltedNamespace]byte
	b := buf[:0]
	if n := len(ns) + 1 + len(salt); n > len(buf) {
		b = make([]byte, 0, n)
	}
	b = append(append(append(b, ns...), 0), salt...)
	return HashSeed + xxh3.HashSeed(b, 1)
}

// SaltedNamespace returns the hasher namespace of blocks stored under a
// cache salt (vLLM's and SGLang's cache_salt): the salt itself under an
// empty namespace, which is exactly Dynamo's cache_namespace hashing,
// otherwise the namespace, a NUL byte and the salt.
func SaltedNamespace(namespace, salt string) string {
	switch {
	case salt == "":
		return namespace
	case namespace == "":
		return salt
	}
	return namespace + "\x00" + salt
}

// WithSalt returns a copy of h for blocks stored under a request's cache
// salt: its namespace becomes SaltedNamespace(namespace, salt), keeping the
// block size, Eagle mode and LoRA adapter. An empty salt returns h. It
// allocates nothing unless h is salted already or its namespace and the
// salt together are longer than 255 bytes.
func (h Hasher) WithSalt(salt string) Hasher {
	if salt == "" {
		return h
	}
	lora := h.seed - h.baseSeed
	switch {
	case h.namespace == "":
		h.namespace = salt
		h.baseSeed = namespaceSeed(salt)
	default:
		h.salt = SaltedNamespace(h.salt, salt)
		h.baseSeed = saltedSeed(h.namespace, h.salt)
	}
	h.seed = h.baseSeed + lora
	return h
}

// Namespace returns the hasher namespace (with any salt applied).
func (h Hasher) Namespace() string { return SaltedNamespace(h.namespace, h.salt) }

// Eagle reports whether h hashes Eagle windows of BlockSize+1 tokens.
func (h Hasher) Eagle() bool { return h.window != h.blockSize*4 }

// WithEagle returns a copy of h that hashes Eagle windows (on) or plain
// blocks (off).
func (h Hasher) WithEagle(on bool) Hasher {
	h.window = h.blockSize * 4
	if on {
		h.window += 4
	}
	return h
}

// MustHasher is NewHasher for configurations known to be valid, such as
// constants in tests and examples. It panics on an invalid block size.
func MustHasher(cfg HasherConfig) Hasher {
	h, err := NewHasher(cfg)
	if err != nil {
		panic(err)
	}
	return h
}

// WithLoRA returns a copy of h that hashes blocks for the named LoRA adapter
// (empty for the base model), keeping the block size and namespace.
func (h Hasher) WithLoRA(name string) Hasher {
	h.seed = h.baseSeed
	if name != "" {
		h.seed += xxh3.HashString(name)
	}
	return h
}

// BlockSize returns the number of tokens per block.
func (h Hasher) BlockSize() int { return h.blockSize }

// Seed returns the XXH3-64 seed used for block hashes: HashSeed plus the
// namespace and LoRA offsets.
func (h Hasher) Seed() uint64 { return h.seed }

// Valid reports whether h was made by NewHasher (the zero Hasher is not).
func (h Hasher) Valid() bool { return h.blockSize > 0 }

// Blocks returns the number of full blocks in n tokens (with Eagle, the
// number of full windows of BlockSize+1 tokens at stride BlockSize).
func (h Hasher) Blocks(n int) int {
	if h.blockSize <= 0 {
		return 0
	}
	if h.window != h.blockSize*4 {
		n--
		if n <= 0 {
			return 0
		}
	}
	return n / h.blockSize
}

// WindowTokens returns the number of tokens hashed per block: BlockSize,
// or BlockSize+1 with Eagle.
func (h Hasher) WindowTokens() int { return h.window / 4 }

// HashBlock returns the hash of one block of token ids. It hashes whatever
// it is given; callers pass exactly WindowTokens tokens.
func (h Hasher) HashBlock(tokens []uint32) BlockHash {
	return BlockHash(xxh3.HashSeed(tokenBytes(tokens), h.seed))
}

// AppendBlockHashes appends the hash of every full block of tokens to dst
// and returns the extended slice. With enough capacity in dst it allocates
// nothing.
func (h Hasher) AppendBlockHashes(dst []BlockHash, tokens []uint32) []BlockHash {
	n := h.Blocks(len(tokens))
	if n == 0 {
		return dst
	}
	raw, step := tokenBytes(tokens), h.blockSize*4
	for i := range n {
		dst = append(dst, BlockHash(xxh3.HashSeed(raw[i*step:i*step+h.window], h.seed)))
	}
	return dst
}

// AppendSeqHashes appends the chained sequence hash of every full block of
// tokens to dst and returns the extended slice. With enough capacity in dst
// it allocates nothing.
func (h Hasher) AppendSeqHashes(dst []SeqHash, tokens []uint32) []SeqHash {
	n := h.Blocks(len(tokens))
	if n == 0 {
		return dst
	}
	raw, step, w, seed := tokenBytes(tokens), h.blockSize*4, h.window, h.seed
	dst = slices.Grow(dst, n)
	if h.fast64() {
		// n blocks of 64 bytes lie inside raw: n = len(tokens)/16.
		k, p := seededKeys64(seed), unsafe.Pointer(unsafe.SliceData(raw))
		prev := SeqHash(hash64(p, &k))
		dst = append(dst, prev)
		for i := 1; i < n; i++ {
			prev = NextSeqHash(prev, BlockHash(hash64(unsafe.Add(p, i*window64), &k)))
			dst = append(dst, prev)
		}
		return dst
	}
	prev := SeqHash(xxh3.HashSeed(raw[:w], seed))
	dst = append(dst, prev)
	for i := 1; i < n; i++ {
		prev = NextSeqHash(prev, BlockHash(xxh3.HashSeed(raw[i*step:i*step+w], seed)))
		dst = append(dst, prev)
	}
	return dst
}

// AppendHashes appends both the block hashes and the chained sequence hashes
// of every full block of tokens, for callers that need both (the indexer's
// events carry block hashes; matching uses sequence hashes).
func (h Hasher) AppendHashes(blocks []BlockHash, seqs []SeqHash, tokens []uint32) ([]BlockHash, []SeqHash) {
	n := h.Blocks(len(tokens))
	if n == 0 {
		return blocks, seqs
	}
	raw, step := tokenBytes(tokens), h.blockSize*4
	fast, k, p := h.fast64(), seededKeys64(h.seed), unsafe.Pointer(unsafe.SliceData(raw))
	var prev SeqHash
	for i := range n {
		var local BlockHash
		if fast { // n blocks of 64 bytes lie inside raw: n = len(tokens)/16
			local = BlockHash(hash64(unsafe.Add(p, i*window64), &k))
		} else {
			local = BlockHash(xxh3.HashSeed(raw[i*step:i*step+h.window], h.seed))
		}
		if i == 0 {
			prev = SeqHash(local)
		} else {
			prev = NextSeqHash(prev, local)
		}
		blocks = append(blocks, local)
		seqs = append(seqs, prev)
	}
	return blocks, seqs
}

// NextSeqHash chains one block onto the sequence hash of its parent:
// XXH3-64(le64(parent) ‖ le64(block), HashSeed).
//
// The input is always 16 bytes, so this is XXH3's 9-to-16-byte path
// specialised for that length and seed: two keyed words, one folded
// 128-bit multiply and the avalanche. FuzzNextSeqHash checks it against the
// general XXH3 implementation.
func NextSeqHash(parent SeqHash, block BlockHash) SeqHash {
	// The XXH3 default secret's words at byte offsets 24, 32, 40 and 48.
	const (
		secret24 = 0x1f67b3b7a4a44072
		secret32 = 0x78e5c0cc4ee679cb
		secret40 = 0x2172ffcc7dd05a82
		secret48 = 0x8e2443f7744608b8
		flipLo   = secret24 ^ secret32 + HashSeed
		flipHi   = secret40 ^ secret48 - HashSeed
	)
	lo := uint64(parent) ^ flipLo
	hi := uint64(block) ^ flipHi
	mulHi, mulLo := bits.Mul64(lo, hi)
	acc := 16 + bits.ReverseBytes64(lo) + hi + (mulHi ^ mulLo)
	acc ^= acc >> 37
	acc *= 0x165667919e3779f9
	acc ^= acc >> 32
	return SeqHash(acc)
}

// ChainSeqHashes appends the sequence hashes of blocks to dst. When
// hasParent is false the first block starts a sequence (its sequence hash
// is its block hash); otherwise every block is chained onto parent.
func ChainSeqHashes(dst []SeqHash, parent SeqHash, hasParent bool, blocks []BlockHash) []SeqHash {
	for _, b := range blocks {
		if hasParent {
			parent = NextSeqHash(parent, b)
		} else {
			parent, hasParent = SeqHash(b), true
		}
		dst = append(dst, parent)
	}
	return dst
}

// littleEndian reports whether uint32 values are stored little-endian in
// memory, so that token ids can be hashed in place.
var littleEndian = func() bool {
	x := uint32(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// tokenBytes returns token ids as little-endian bytes. On little-endian
// machines it is a view of the slice's own memory (no copy); elsewhere it is
// a converted copy.
func tokenBytes(tokens []uint32) []byte {
	if len(tokens) == 0 {
		return nil
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), len(tokens)*4)
	}
	b := make([]byte, len(tokens)*4)
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[i*4:], t)
	}
	return b
}
