package kvroute_test

import (
	"encoding/json"
	"math"
	"os"
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
	require.GreaterOrEqual(t, len(vs.Vectors), 16)
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
