package kvroute_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute"
)

// The vectors come from NVIDIA Dynamo's router tests.
func TestXXH3Vector(t *testing.T) {
	require.Equal(t, uint64(13226331709069118873), xxh3.HashSeed([]byte("test data"), kvroute.HashSeed))
}

func TestHasherDynamoVectors(t *testing.T) {
	tokens := []uint32{0, 1, 2, 3, 4, 5, 6, 7}
	tests := []struct {
		name      string
		cfg       kvroute.HasherConfig
		seed      uint64
		locals    []kvroute.BlockHash
		seqSecond kvroute.SeqHash
	}{
		{
			name:      "base",
			cfg:       kvroute.HasherConfig{BlockSize: 4},
			seed:      1337,
			locals:    []kvroute.BlockHash{0x7ee2cbedc694ab46, 0xa8416cfd935bdb13},
			seqSecond: 0x83fb702f20e2ad65,
		},
		{
			name:   "lora",
			cfg:    kvroute.HasherConfig{BlockSize: 4, LoRA: "adapter-a"},
			seed:   8842669519798868182,
			locals: []kvroute.BlockHash{6665157333201000639, 11721812545976571723},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := kvroute.NewHasher(tt.cfg)
			require.NoError(t, err)
			require.Equal(t, tt.seed, h.Seed())
			require.Equal(t, tt.locals, h.AppendBlockHashes(nil, tokens))
			seqs := h.AppendSeqHashes(nil, tokens)
			require.Len(t, seqs, 2)
			require.Equal(t, kvroute.SeqHash(tt.locals[0]), seqs[0])
			require.Equal(t, kvroute.NextSeqHash(seqs[0], tt.locals[1]), seqs[1])
			if tt.seqSecond != 0 {
				require.Equal(t, tt.seqSecond, seqs[1])
			}
			blocks, seqs2 := h.AppendHashes(nil, nil, tokens)
			require.Equal(t, tt.locals, blocks)
			require.Equal(t, seqs, seqs2)
			require.Equal(t, seqs, kvroute.ChainSeqHashes(nil, 0, false, blocks))
		})
	}
}

func TestHasherNamespaceAndLoRA(t *testing.T) {
	base := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	ns := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4, Namespace: "tenant-1"})
	require.Equal(t, base.Seed()+xxh3.HashStringSeed("tenant-1", 1), ns.Seed())
	both := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4, Namespace: "tenant-1", LoRA: "adapter-a"})
	require.Equal(t, ns.Seed()+xxh3.HashString("adapter-a"), both.Seed())
	require.Equal(t, both, ns.WithLoRA("adapter-a"))
	require.Equal(t, ns, both.WithLoRA(""))
}

func TestHasherPartialBlockAndConfig(t *testing.T) {
	h := kvroute.MustHasher(kvroute.HasherConfig{})
	require.Equal(t, kvroute.DefaultBlockSize, h.BlockSize())
	require.Empty(t, h.AppendBlockHashes(nil, make([]uint32, 15)))
	require.Len(t, h.AppendSeqHashes(nil, make([]uint32, 33)), 2)
	require.Equal(t, 2, h.Blocks(33))
	for _, bs := range []int{-1, kvroute.MaxBlockSize + 1} {
		_, err := kvroute.NewHasher(kvroute.HasherConfig{BlockSize: bs})
		require.ErrorIs(t, err, kvroute.ErrBlockSize)
	}
	require.False(t, kvroute.Hasher{}.Valid())
	require.Empty(t, kvroute.Hasher{}.AppendSeqHashes(nil, make([]uint32, 64)))
}

func TestHasherZeroAlloc(t *testing.T) {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})
	tokens := make([]uint32, 4096)
	dst := make([]kvroute.SeqHash, 0, 256)
	blocks := make([]kvroute.BlockHash, 0, 256)
	allocs := testing.AllocsPerRun(20, func() {
		dst = h.AppendSeqHashes(dst[:0], tokens)
		blocks, dst = h.AppendHashes(blocks[:0], dst[:0], tokens)
	})
	require.Zero(t, allocs)
}

// referenceHashes is a plain implementation written for clarity: convert
// every block to little-endian bytes, hash it, and chain.
func referenceHashes(tokens []uint32, blockSize int, seed uint64) ([]uint64, []uint64) {
	var locals, seqs []uint64
	for start := 0; start+blockSize <= len(tokens); start += blockSize {
		var buf []byte
		for _, tok := range tokens[start : start+blockSize] {
			buf = binary.LittleEndian.AppendUint32(buf, tok)
		}
		local := xxh3.HashSeed(buf, seed)
		locals = append(locals, local)
		if len(seqs) == 0 {
			seqs = append(seqs, local)
			continue
		}
		var pair []byte
		pair = binary.LittleEndian.AppendUint64(pair, seqs[len(seqs)-1])
		pair = binary.LittleEndian.AppendUint64(pair, local)
		seqs = append(seqs, xxh3.HashSeed(pair, 1337))
	}
	return locals, seqs
}

func FuzzHasherMatchesReference(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0}, uint8(4), "")
	f.Add(make([]byte, 4*64), uint8(16), "adapter-a")
	f.Add([]byte("sixty-four bytes of token ids hashed by the 16-token fast path....."), uint8(15), "adapter-b")
	f.Fuzz(func(t *testing.T, raw []byte, bs uint8, lora string) {
		blockSize := int(bs%64) + 1
		tokens := make([]uint32, len(raw)/4)
		for i := range tokens {
			tokens[i] = binary.LittleEndian.Uint32(raw[i*4:])
		}
		h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: blockSize, LoRA: lora})
		wantLocals, wantSeqs := referenceHashes(tokens, blockSize, h.Seed())
		locals, seqs := h.AppendHashes(nil, nil, tokens)
		if len(locals) != len(wantLocals) || len(seqs) != len(wantSeqs) {
			t.Fatalf("lengths: got %d/%d want %d/%d", len(locals), len(seqs), len(wantLocals), len(wantSeqs))
		}
		for i := range locals {
			if uint64(locals[i]) != wantLocals[i] || uint64(seqs[i]) != wantSeqs[i] {
				t.Fatalf("block %d: got %x/%x want %x/%x", i, locals[i], seqs[i], wantLocals[i], wantSeqs[i])
			}
		}
		only := h.AppendSeqHashes(nil, tokens)
		for i := range only {
			if uint64(only[i]) != wantSeqs[i] {
				t.Fatalf("AppendSeqHashes block %d: got %x want %x", i, only[i], wantSeqs[i])
			}
		}
	})
}

// TestHasher16MatchesReference checks the 16-token path (XXH3 written out
// for 64-byte blocks) against the reference for many seeds and prompts.
func TestHasher16MatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 500 {
		ns := fmt.Sprintf("tenant-%d", rng.Uint64())
		h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16, Namespace: ns})
		tokens := make([]uint32, rng.IntN(300))
		for i := range tokens {
			tokens[i] = rng.Uint32()
		}
		wantLocals, wantSeqs := referenceHashes(tokens, 16, h.Seed())
		locals, seqs := h.AppendHashes(nil, nil, tokens)
		only := h.AppendSeqHashes(nil, tokens)
		require.Len(t, locals, len(wantLocals), "trial %d", trial)
		require.Len(t, only, len(wantSeqs), "trial %d", trial)
		for i := range wantLocals {
			require.Equal(t, wantLocals[i], uint64(locals[i]), "trial %d block %d", trial, i)
			require.Equal(t, wantSeqs[i], uint64(seqs[i]), "trial %d block %d", trial, i)
			require.Equal(t, wantSeqs[i], uint64(only[i]), "trial %d block %d", trial, i)
		}
	}
}

func FuzzNextSeqHash(f *testing.F) {
	f.Add(uint64(0), uint64(0))
	f.Add(uint64(0x7ee2cbedc694ab46), uint64(0xa8416cfd935bdb13))
	f.Add(^uint64(0), uint64(1))
	f.Fuzz(func(t *testing.T, parent, block uint64) {
		var buf []byte
		buf = binary.LittleEndian.AppendUint64(buf, parent)
		buf = binary.LittleEndian.AppendUint64(buf, block)
		want := xxh3.HashSeed(buf, kvroute.HashSeed)
		if got := kvroute.NextSeqHash(kvroute.SeqHash(parent), kvroute.BlockHash(block)); uint64(got) != want {
			t.Fatalf("NextSeqHash(%#x, %#x) = %#x, want %#x", parent, block, got, want)
		}
	})
}

// One Hasher and one prompt are shared by goroutines that hash, derive
// salted, LoRA and Eagle variants and hash with items, as the router's
// Select calls do: every result equals the one computed alone (and the race
// detector sees no race).
func TestHasherConcurrentUse(t *testing.T) {
	h := kvroute.MustHasher(kvroute.HasherConfig{Namespace: "model-a"})
	tokens := make([]uint32, 1000)
	for i := range tokens {
		tokens[i] = uint32(i * 7919)
	}
	mm := []kvroute.MMObject{{Hash: 5, Offset: 300, Length: 100}, {Hash: 4, Offset: 40, Length: 8}}
	variant := func(i int) kvroute.Hasher {
		return h.WithSalt(fmt.Sprint("tenant-", i%3)).WithLoRA(fmt.Sprint("adapter-", i%2)).WithEagle(i%4 == 0)
	}
	type result struct {
		seqs, mmSeqs []kvroute.SeqHash
		blocks       []kvroute.BlockHash
	}
	hash := func(i int) result {
		v := variant(i)
		blocks, seqs := v.AppendHashes(nil, nil, tokens)
		return result{seqs: seqs, blocks: blocks, mmSeqs: v.AppendSeqHashesMM(nil, tokens, mm)}
	}
	const goroutines = 12
	want := make([]result, goroutines)
	for i := range want {
		want[i] = hash(i)
	}
	got := make([]result, goroutines)
	var wg sync.WaitGroup
	for i := range goroutines {
		wg.Go(func() {
			for range 20 {
				got[i] = hash(i)
			}
		})
	}
	wg.Wait()
	require.Equal(t, want, got)
}
