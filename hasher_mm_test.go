package kvroute_test

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/big"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute"
)

// dynamoVectors are block hashes computed by Dynamo's own
// compute_block_hash_for_seq (testdata/dynamo_hash_vectors.py).
type dynamoVectors struct {
	Vectors []struct {
		Name        string
		Tokens      []uint32
		BlockSize   int `json:"block_size"`
		LoRA        string
		Namespace   string
		Eagle       bool
		MM          []struct{ Hash, Offset, Length uint64 }
		BlockHashes []kvroute.BlockHash `json:"block_hashes"`
	}
}

func TestHasherMatchesDynamoVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/dynamo_hash_vectors.json")
	require.NoError(t, err)
	var vs dynamoVectors
	require.NoError(t, json.Unmarshal(raw, &vs))
	require.GreaterOrEqual(t, len(vs.Vectors), 26)
	for _, v := range vs.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			var mm []kvroute.MMObject
			for _, o := range v.MM {
				mm = append(mm, kvroute.MMObject{Hash: o.Hash, Offset: int(o.Offset), Length: int(o.Length)})
			}
			// The namespace as a salt on a hasher without one, and as the
			// hasher's own namespace, hash alike.
			salted := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: v.BlockSize, LoRA: v.LoRA, Eagle: v.Eagle}).WithSalt(v.Namespace)
			direct := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: v.BlockSize, LoRA: v.LoRA, Eagle: v.Eagle, Namespace: v.Namespace})
			require.Equal(t, direct, salted)
			h := salted
			require.Equal(t, len(v.BlockHashes), h.Blocks(len(v.Tokens)))
			blocks, seqs := h.AppendHashesMM(nil, nil, v.Tokens, mm)
			require.Equal(t, v.BlockHashes, blocks)
			require.Equal(t, kvroute.ChainSeqHashes(nil, 0, false, blocks), seqs)
			require.Equal(t, seqs, h.AppendSeqHashesMM(nil, v.Tokens, mm))
			if len(mm) == 0 {
				require.Equal(t, v.BlockHashes, h.AppendBlockHashes(nil, v.Tokens))
				require.Equal(t, seqs, h.AppendSeqHashes(nil, v.Tokens))
			}
		})
	}
}

func TestHasherSaltEagleAndMMSeparate(t *testing.T) {
	toks := make([]uint32, 65)
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})
	plain := h.AppendSeqHashes(nil, toks)
	salted := h.WithSalt("tenant-a").AppendSeqHashes(nil, toks)
	eagle := h.WithEagle(true).AppendSeqHashes(nil, toks)
	img1 := h.AppendSeqHashesMM(nil, toks, []kvroute.MMObject{{Hash: 1, Offset: 16, Length: 16}})
	img2 := h.AppendSeqHashesMM(nil, toks, []kvroute.MMObject{{Hash: 2, Offset: 16, Length: 16}})
	require.Len(t, plain, 4)
	require.Len(t, eagle, 4)
	for i := range plain {
		require.NotEqual(t, plain[i], salted[i])
		require.NotEqual(t, plain[i], eagle[i])
	}
	// The block before the image is shared; from the image on, nothing is.
	require.Equal(t, plain[0], img1[0])
	require.Equal(t, img1[0], img2[0])
	for i := 1; i < 4; i++ {
		require.NotEqual(t, img1[i], img2[i])
		require.NotEqual(t, plain[i], img1[i])
	}
	// Salting keeps the LoRA offset; a salted namespace extends the host's.
	l := h.WithLoRA("adapter-a")
	require.Equal(t, l.Seed()-h.Seed(), l.WithSalt("s").Seed()-h.WithSalt("s").Seed())
	ns := kvroute.MustHasher(kvroute.HasherConfig{Namespace: "model-a"}).WithSalt("s")
	require.Equal(t, "model-a\x00s", ns.Namespace())
	require.Equal(t, kvroute.HashSeed+xxh3.HashStringSeed("model-a\x00s", 1), ns.Seed())
	require.True(t, h.WithEagle(true).Eagle())
	require.Equal(t, 17, h.WithEagle(true).WindowTokens())
	require.Equal(t, 0, h.WithEagle(true).Blocks(16))
	require.Equal(t, 1, h.WithEagle(true).Blocks(17))
}

func TestMMIdentifierHash(t *testing.T) {
	tests := []struct {
		id   string
		want uint64
		ok   bool
	}{
		{"", 0, false},
		// Dynamo's vectors: a 64-digit hex digest keeps its first 16 digits.
		{"0123456789abcdef000000000000000000000000000000000000000000000000", 0x0123456789abcdef, true},
		{"0123456789abcdef00112233445566778899aabbccddeefffedcba9876543210", 0x0123456789abcdef, true},
		{"image-1", xxh3.HashString("image-1"), true},
		{"0123456789abcdefXX0000000000000000000000000000000000000000000000", xxh3.HashString("0123456789abcdefXX0000000000000000000000000000000000000000000000"), true},
	}
	for _, tt := range tests {
		got, ok := kvroute.MMIdentifierHash(tt.id)
		require.Equal(t, tt.ok, ok, tt.id)
		require.Equal(t, tt.want, got, tt.id)
	}
}

func TestHashBlockMMOrderAndAllocatesNothing(t *testing.T) {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})
	toks := make([]uint32, 16)
	require.Equal(t, h.HashBlock(toks), h.HashBlockMM(toks, nil))
	a := h.HashBlockMM(toks, []uint64{3, 1, 2})
	require.Equal(t, a, h.HashBlockMM(toks, []uint64{1, 2, 3}))
	mm := []uint64{9, 4}
	allocs := testing.AllocsPerRun(100, func() { _ = h.HashBlockMM(toks, mm) })
	require.Zero(t, allocs)
}

// An item that reaches past the largest int covers every block from its
// offset on, as one that ends at the prompt's end does: its end is never
// computed by a sum that wraps.
func TestHasherMMItemToTheEnd(t *testing.T) {
	toks := make([]uint32, 64)
	for i := range toks {
		toks[i] = uint32(i)
	}
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})
	toEnd := h.AppendSeqHashesMM(nil, toks, []kvroute.MMObject{{Hash: 9, Offset: 16, Length: 48}})
	huge := h.AppendSeqHashesMM(nil, toks, []kvroute.MMObject{{Hash: 9, Offset: 16, Length: math.MaxInt}})
	require.Equal(t, toEnd, huge)
	before := h.AppendSeqHashesMM(nil, toks, []kvroute.MMObject{{Hash: 9, Offset: math.MinInt, Length: math.MaxInt}})
	require.Equal(t, h.AppendSeqHashes(nil, toks), before, "an item that ends before the prompt covers nothing")
}

// referenceMM hashes tokens as Dynamo's compute_block_hash_for_seq does,
// written for clarity: the seed from the LoRA name and the namespace, a
// window of blockSize tokens (one more with Eagle) at every multiple of
// blockSize that fits, and after a window's tokens the sorted hashes of the
// items whose placeholder range overlaps the block's stride.
func referenceMM(tokens []uint32, blockSize int, lora, namespace string, eagle bool, mm []kvroute.MMObject) []kvroute.BlockHash {
	seed := kvroute.HashSeed
	if lora != "" {
		seed += xxh3.HashString(lora)
	}
	if namespace != "" {
		seed += xxh3.HashStringSeed(namespace, 1)
	}
	window := blockSize
	if eagle {
		window++
	}
	var out []kvroute.BlockHash
	for start := 0; start+window <= len(tokens); start += blockSize {
		var buf []byte
		for _, tok := range tokens[start : start+window] {
			buf = binary.LittleEndian.AppendUint32(buf, tok)
		}
		var in []uint64
		for _, o := range mm {
			// The item covers [Offset, Offset+Length), summed without
			// overflow.
			end := new(big.Int).Add(big.NewInt(int64(o.Offset)), big.NewInt(int64(o.Length)))
			if o.Length > 0 && o.Offset < start+blockSize && end.Cmp(big.NewInt(int64(start))) > 0 {
				in = append(in, o.Hash)
			}
		}
		slices.Sort(in)
		for _, x := range in {
			buf = binary.LittleEndian.AppendUint64(buf, x)
		}
		out = append(out, kvroute.BlockHash(xxh3.HashSeed(buf, seed)))
	}
	return out
}

// FuzzHasherMMMatchesReference checks AppendHashesMM, AppendSeqHashesMM
// and HashBlockMM against referenceMM for any block size, LoRA name,
// namespace, cache salt, Eagle mode and items (unsorted, overlapping, repeated, empty,
// negative or reaching past the largest int).
func FuzzHasherMMMatchesReference(f *testing.F) {
	f.Add([]byte("sixty-four bytes of token ids hashed by the 16-token fast path....."), uint8(16), "", "", "", false, []byte{1, 10, 20, 2, 35, 20})
	f.Add(make([]byte, 4*70), uint8(16), "adapter-a", "tenant-a", "", true, []byte{7, 30, 5, 7, 12, 40, 3, 0, 255})
	f.Add(make([]byte, 4*33), uint8(4), "", "tenant-b", "user-1", false, []byte{1, 200, 0, 1, 2, 1, 9, 4, 4, 9, 4, 4})
	f.Add(make([]byte, 4*40), uint8(16), "adapter-b", "", "user-2", false, []byte{2, 9, 9})
	f.Fuzz(func(t *testing.T, raw []byte, bs uint8, lora, namespace, salt string, eagle bool, items []byte) {
		blockSize := int(bs%40) + 1
		tokens := make([]uint32, len(raw)/4)
		for i := range tokens {
			tokens[i] = binary.LittleEndian.Uint32(raw[i*4:])
		}
		// Three bytes an item: a hash out of four (so that items repeat),
		// an offset and a length; 255 stands for the extremes of int.
		var mm []kvroute.MMObject
		for i := 0; i+3 <= len(items); i += 3 {
			o := kvroute.MMObject{Hash: uint64(items[i]%4) * 0x9e3779b97f4a7c15, Offset: int(items[i+1]) - 8, Length: int(items[i+2]) - 2}
			if items[i+1] == 255 {
				o.Offset = math.MinInt
			}
			if items[i+2] == 255 {
				o.Length = math.MaxInt
			}
			mm = append(mm, o)
		}
		orig := slices.Clone(mm)
		// A request's cache salt extends the namespace: namespace, NUL, salt.
		h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: blockSize, LoRA: lora, Namespace: namespace, Eagle: eagle}).WithSalt(salt)
		switch {
		case salt == "":
		case namespace == "":
			namespace = salt
		default:
			namespace += "\x00" + salt
		}
		want := referenceMM(tokens, blockSize, lora, namespace, eagle, mm)
		blocks, seqs := h.AppendHashesMM(nil, nil, tokens, mm)
		if !slices.Equal(blocks, want) {
			t.Fatalf("AppendHashesMM blocks %x, want %x", blocks, want)
		}
		wantSeqs := kvroute.ChainSeqHashes(nil, 0, false, want)
		if !slices.Equal(seqs, wantSeqs) {
			t.Fatalf("AppendHashesMM seqs %x, want %x", seqs, wantSeqs)
		}
		if only := h.AppendSeqHashesMM(nil, tokens, mm); !slices.Equal(only, wantSeqs) {
			t.Fatalf("AppendSeqHashesMM %x, want %x", only, wantSeqs)
		}
		if !slices.Equal(mm, orig) {
			t.Fatalf("items modified: %v, were %v", mm, orig)
		}
		if len(want) > 0 {
			var hashes []uint64
			for _, o := range mm {
				hashes = append(hashes, o.Hash)
			}
			tok := tokens[:h.WindowTokens()]
			if got, ref := h.HashBlockMM(tok, hashes), referenceMM(tok, blockSize, lora, namespace, eagle, everywhere(hashes)); got != ref[0] {
				t.Fatalf("HashBlockMM %x, want %x", got, ref[0])
			}
		}
	})
}

// everywhere returns items of the given hashes that cover every block.
func everywhere(hashes []uint64) []kvroute.MMObject {
	var mm []kvroute.MMObject
	for _, x := range hashes {
		mm = append(mm, kvroute.MMObject{Hash: x, Length: math.MaxInt})
	}
	return mm
}

// Hashing a prompt with items allocates nothing when dst has room: items in
// order of offset (however many), or up to eight in any order.
func TestHasherMMAllocatesNothing(t *testing.T) {
	h := kvroute.MustHasher(kvroute.HasherConfig{})
	toks := make([]uint32, 4096)
	sorted := make([]kvroute.MMObject, 200)
	for i := range sorted {
		sorted[i] = kvroute.MMObject{Hash: uint64(i), Offset: i * 20, Length: 30}
	}
	unsorted := []kvroute.MMObject{{Hash: 3, Offset: 900, Length: 600}, {Hash: 1, Offset: 10, Length: 50}, {Hash: 2, Offset: 40, Length: 5}}
	dst := make([]kvroute.SeqHash, 0, 256)
	blocks := make([]kvroute.BlockHash, 0, 256)
	for _, mm := range [][]kvroute.MMObject{sorted, unsorted} {
		allocs := testing.AllocsPerRun(20, func() {
			dst = h.AppendSeqHashesMM(dst[:0], toks, mm)
			blocks, dst = h.AppendHashesMM(blocks[:0], dst[:0], toks, mm)
		})
		require.Zero(t, allocs)
	}
}

// The same image twice within one block counts twice, as the engine's
// extra keys list it, and an image split into two items within one block
// counts twice too: a host gives one item per engine input.
func TestHasherMMRepeatedItemInABlock(t *testing.T) {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})
	toks := make([]uint32, 32)
	for i := range toks {
		toks[i] = uint32(100 + i)
	}
	const img = 0xfeed
	twice, _ := h.AppendHashesMM(nil, nil, toks, []kvroute.MMObject{{Hash: img, Offset: 2, Length: 4}, {Hash: img, Offset: 8, Length: 4}})
	once, _ := h.AppendHashesMM(nil, nil, toks, []kvroute.MMObject{{Hash: img, Offset: 2, Length: 10}})
	require.Equal(t, h.HashBlockMM(toks[:16], []uint64{img, img}), twice[0])
	require.Equal(t, h.HashBlockMM(toks[:16], []uint64{img}), once[0])
	require.NotEqual(t, once[0], twice[0])
	require.Equal(t, h.HashBlock(toks[16:]), twice[1], "no item reaches the second block")
}

// A salt under a namespace hashes as the salted namespace would as the
// hasher's own namespace, salts chain, and salting allocates nothing (the
// router salts a request's hasher on every Select).
func TestHasherSaltUnderNamespace(t *testing.T) {
	long := strings.Repeat("s", 300)
	tests := []struct {
		name, namespace string
		salts           []string
	}{
		{"no namespace", "", []string{"tenant-a"}},
		{"namespace", "model-a", []string{"tenant-a"}},
		{"two salts", "", []string{"tenant-a", "user-7"}},
		{"namespace and two salts", "model-a", []string{"tenant-a", "user-7"}},
		{"long salt", "model-a", []string{long}},
	}
	toks := make([]uint32, 64)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := kvroute.MustHasher(kvroute.HasherConfig{Namespace: tt.namespace, LoRA: "adapter-a"})
			ns := tt.namespace
			for _, s := range tt.salts {
				h, ns = h.WithSalt(s), kvroute.SaltedNamespace(ns, s)
			}
			direct := kvroute.MustHasher(kvroute.HasherConfig{Namespace: ns, LoRA: "adapter-a"})
			require.Equal(t, ns, h.Namespace())
			require.Equal(t, direct.Seed(), h.Seed())
			require.Equal(t, direct.AppendSeqHashes(nil, toks), h.AppendSeqHashes(nil, toks))
		})
	}
	h := kvroute.MustHasher(kvroute.HasherConfig{Namespace: "model-a"})
	salt := "tenant-a"
	var salted kvroute.Hasher
	require.Zero(t, testing.AllocsPerRun(100, func() { salted = h.WithSalt(salt) }))
	require.NotEqual(t, h.Seed(), salted.Seed())
}
