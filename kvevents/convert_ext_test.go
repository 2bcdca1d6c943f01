package kvevents_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
)

// extraKeys encodes vLLM's untagged per-block extra_keys: each block nil or
// a list of keys, a key a string, an [identifier, offset] pair or bytes.
func extraKeys(blocks ...[]any) []byte {
	b := msgp.AppendArrayHeader(nil, uint32(len(blocks)))
	for _, keys := range blocks {
		if keys == nil {
			b = msgp.AppendNil(b)
			continue
		}
		b = msgp.AppendArrayHeader(b, uint32(len(keys)))
		for _, k := range keys {
			var err error
			b, err = msgp.AppendIntf(b, k)
			if err != nil {
				panic(err)
			}
		}
	}
	return b
}

// matchDepth returns how many leading blocks of seqs worker w holds.
func matchDepth(ix *indexer.Index, seqs []kvroute.SeqHash, w kvroute.WorkerKey) int {
	var res indexer.MatchResult
	ix.Match(seqs, &res)
	for _, m := range res.Workers {
		if m.Worker == w {
			return m.Blocks
		}
	}
	return 0
}

func applyAll(t *testing.T, ix *indexer.Index, evs []kvroute.Event) {
	t.Helper()
	for i := range evs {
		require.NoError(t, ix.Apply(&evs[i]), evs[i].String())
	}
}

func stored(hashes []uint64, parent uint64, tokens []uint32) kvevents.EngineEvent {
	ev := kvevents.EngineEvent{Type: kvevents.BlockStored, Layout: kvevents.LayoutMap, TokenIDs: tokens, BlockSize: 4}
	for _, h := range hashes {
		ev.BlockHashes = append(ev.BlockHashes, kvevents.UintHash(h))
	}
	if parent != 0 {
		ev.ParentBlockHash = kvevents.UintHash(parent)
	}
	return ev
}

// TestConvertSaltAndMMIsolate: vLLM's cache salt (first block's
// extra_keys, inherited by children) and multimodal identifiers make blocks
// hash as the router hashes a salted or multimodal prompt, and never like
// the unsalted or other-image prompt with the same tokens.
func TestConvertSaltAndMMIsolate(t *testing.T) {
	toks := seq(16, 100)
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	imgA := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	imgB := "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	hashA, _ := kvroute.MMIdentifierHash(imgA)
	hashB, _ := kvroute.MMIdentifierHash(imgB)
	w := kvroute.WorkerKey{ID: 1}

	tests := []struct {
		name   string
		events []kvevents.EngineEvent
		seqs   []kvroute.SeqHash // the prompt the router hashes
		others [][]kvroute.SeqHash
		shared int // blocks the others share (before the first image)
	}{
		{
			name: "salt in the first block, inherited by a child event",
			events: func() []kvevents.EngineEvent {
				a := stored([]uint64{1, 2}, 0, toks[:8])
				a.LoRAName = "adapter-a"
				a.ExtraKeys = extraKeys([]any{"adapter-a", "tenant-a"}, []any{"adapter-a"})
				b := stored([]uint64{3, 4}, 2, toks[8:])
				b.LoRAName = "adapter-a"
				b.ExtraKeys = extraKeys([]any{"adapter-a"}, []any{"adapter-a"})
				return []kvevents.EngineEvent{a, b}
			}(),
			seqs: h.WithLoRA("adapter-a").WithSalt("tenant-a").AppendSeqHashes(nil, toks),
			others: [][]kvroute.SeqHash{
				h.WithLoRA("adapter-a").AppendSeqHashes(nil, toks),
				h.WithLoRA("adapter-a").WithSalt("tenant-b").AppendSeqHashes(nil, toks),
				h.AppendSeqHashes(nil, toks),
			},
		},
		{
			name: "multimodal pairs per block",
			events: []kvevents.EngineEvent{func() kvevents.EngineEvent {
				e := stored([]uint64{1, 2, 3, 4}, 0, toks)
				e.ExtraKeys = extraKeys(nil, []any{[]any{imgA, 2}}, []any{[]any{imgA, -2}, []any{imgB, 3}}, []any{[]any{imgB, -1}})
				return e
			}()},
			seqs: h.AppendSeqHashesMM(nil, toks, []kvroute.MMObject{{Hash: hashA, Offset: 6, Length: 4}, {Hash: hashB, Offset: 11, Length: 3}}),
			others: [][]kvroute.SeqHash{
				h.AppendSeqHashes(nil, toks),
				h.AppendSeqHashesMM(nil, toks, []kvroute.MMObject{{Hash: hashB, Offset: 6, Length: 4}, {Hash: hashB, Offset: 11, Length: 3}}),
			},
			shared: 1,
		},
		{
			name: "SGLang cache_salt field",
			events: []kvevents.EngineEvent{func() kvevents.EngineEvent {
				e := stored([]uint64{1, 2, 3, 4}, 0, toks)
				e.CacheSalt = "tenant-a"
				return e
			}()},
			seqs:   h.WithSalt("tenant-a").AppendSeqHashes(nil, toks),
			others: [][]kvroute.SeqHash{h.AppendSeqHashes(nil, toks)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 1, BlockSize: 4})
			require.NoError(t, err)
			evs, err := c.Convert(nil, &kvevents.Batch{Events: tt.events})
			require.NoError(t, err)
			ix, err := indexer.New(indexer.Config{Hasher: h})
			require.NoError(t, err)
			applyAll(t, ix, evs)
			require.Equal(t, 4, matchDepth(ix, tt.seqs, w))
			for _, o := range tt.others {
				require.Equal(t, tt.shared, matchDepth(ix, o, w))
			}
		})
	}
}

func TestConvertLoRAIDTable(t *testing.T) {
	c, err := kvevents.NewConverter(kvevents.ConverterConfig{BlockSize: 4, LoRAs: map[int64]string{7: "adapter-a"}})
	require.NoError(t, err)
	known := stored([]uint64{1}, 0, seq(4, 0))
	known.LoRAID = kvevents.Some(7)
	unknown := stored([]uint64{2}, 0, seq(4, 0))
	unknown.LoRAID = kvevents.Some(8)
	evs, err := c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{known, unknown}})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, "adapter-a", evs[0].LoRA)
	require.Equal(t, kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4, LoRA: "adapter-a"}).HashBlock(seq(4, 0)), evs[0].Blocks[0].Hash)
	require.EqualValues(t, 1, c.Stats().UnknownLoRA)
}

// TestConvertHybridKeepsFullAttention runs a two-group model the way vLLM
// publishes it: both groups store the same blocks under the same hashes
// (kinds on the stores), the sliding-window group evicts most of them
// (group_idx only). Every full-attention block stays matched.
func TestConvertHybridKeepsFullAttention(t *testing.T) {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	toks := seq(24, 1)
	hashes := []uint64{11, 12, 13, 14, 15, 16}
	full := stored(hashes, 0, toks)
	full.GroupIdx, full.SpecKind = kvevents.Some(0), kvevents.KindFullAttention
	swa := stored(hashes, 0, toks)
	swa.GroupIdx, swa.SpecKind, swa.SlidingWindow = kvevents.Some(1), kvevents.KindSlidingWindow, kvevents.Some(8)
	evict := kvevents.EngineEvent{Type: kvevents.BlockRemoved, GroupIdx: kvevents.Some(1)}
	for _, x := range hashes[:4] {
		evict.BlockHashes = append(evict.BlockHashes, kvevents.UintHash(x))
	}
	mamba := kvevents.EngineEvent{Type: kvevents.BlockRemoved, GroupIdx: kvevents.Some(2), BlockHashes: []kvevents.Hash{kvevents.UintHash(16)}}
	unlearned := kvevents.EngineEvent{Type: kvevents.BlockRemoved, GroupIdx: kvevents.Some(3), BlockHashes: []kvevents.Hash{kvevents.UintHash(15)}}

	c, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 2, BlockSize: 4, GroupKinds: map[int64]string{2: kvevents.KindMamba}})
	require.NoError(t, err)
	evs, err := c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{full, swa, evict, mamba, unlearned}})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	ix, err := indexer.New(indexer.Config{Hasher: h})
	require.NoError(t, err)
	applyAll(t, ix, evs)
	require.Equal(t, 6, matchDepth(ix, h.AppendSeqHashes(nil, toks), kvroute.WorkerKey{ID: 2}))
	st := c.Stats()
	require.EqualValues(t, 4, st.SkippedGroupEvents)
	require.EqualValues(t, 6+4+1+1, st.SkippedGroupBlocks)

	// A full-attention eviction (group 0, learned) does remove.
	evs, err = c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{{Type: kvevents.BlockRemoved,
		GroupIdx: kvevents.Some(0), BlockHashes: []kvevents.Hash{kvevents.UintHash(16)}}}})
	require.NoError(t, err)
	applyAll(t, ix, evs)
	require.Equal(t, 5, matchDepth(ix, h.AppendSeqHashes(nil, toks), kvroute.WorkerKey{ID: 2}))

	// MLA groups decide reuse too; other kinds can be whitelisted.
	for _, kind := range []string{kvevents.KindMLAAttention, kvevents.KindSinkFullAttention} {
		c2, err := kvevents.NewConverter(kvevents.ConverterConfig{BlockSize: 4,
			ReuseKinds: []string{kvevents.KindFullAttention, kvevents.KindMLAAttention, kvevents.KindSinkFullAttention}})
		require.NoError(t, err)
		ev := stored(hashes, 0, toks)
		ev.GroupIdx, ev.SpecKind = kvevents.Some(5), kind
		evs, err := c2.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{ev}})
		require.NoError(t, err)
		require.Len(t, evs, 1, kind)
	}
}

func TestConvertDefaultRank(t *testing.T) {
	c, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 3, Rank: 2, BlockSize: 4})
	require.NoError(t, err)
	evs, err := c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{{Type: kvevents.AllBlocksCleared}}})
	require.NoError(t, err)
	require.Equal(t, kvroute.WorkerKey{ID: 3, Rank: 2}, evs[0].Worker)
	evs, err = c.Convert(nil, &kvevents.Batch{DPRank: kvevents.Some(5), Events: []kvevents.EngineEvent{{Type: kvevents.AllBlocksCleared}}})
	require.NoError(t, err)
	require.Equal(t, kvroute.WorkerKey{ID: 3, Rank: 5}, evs[0].Worker)
}

// TestConvertRechunkPageSizeOne feeds SGLang-style page-size-1 events into
// a 4-token router: the blocks index as 4-token blocks, continuing across
// events, and a router prompt matches them.
func TestConvertRechunkPageSizeOne(t *testing.T) {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	toks := seq(14, 50)
	page := func(from, to int, parent int64) kvevents.EngineEvent {
		ev := kvevents.EngineEvent{Type: kvevents.BlockStored, Layout: kvevents.LayoutMap, BlockSize: 1, TokenIDs: toks[from:to]}
		for i := from; i < to; i++ {
			ev.BlockHashes = append(ev.BlockHashes, kvevents.IntHash(int64(-1000-i)))
		}
		if parent != 0 {
			ev.ParentBlockHash = kvevents.IntHash(parent)
		}
		return ev
	}
	c, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 4, BlockSize: 4})
	require.NoError(t, err)
	ix, err := indexer.New(indexer.Config{Hasher: h})
	require.NoError(t, err)
	w := kvroute.WorkerKey{ID: 4}
	for _, ev := range []kvevents.EngineEvent{page(0, 6, 0), page(6, 10, -1005), page(10, 14, -1009)} {
		evs, err := c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{ev}})
		require.NoError(t, err)
		applyAll(t, ix, evs)
	}
	require.Equal(t, 3, matchDepth(ix, h.AppendSeqHashes(nil, toks), w))
	require.EqualValues(t, 3, c.Stats().Rechunked)

	// Evicting the engine page that ends the second block removes it.
	evs, err := c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{{Type: kvevents.BlockRemoved,
		BlockHashes: []kvevents.Hash{kvevents.IntHash(-1007)}}}})
	require.NoError(t, err)
	applyAll(t, ix, evs)
	require.Equal(t, 1, matchDepth(ix, h.AppendSeqHashes(nil, toks), w))

	// Rejecting instead: nothing is indexed, the event is counted.
	r, err := kvevents.NewConverter(kvevents.ConverterConfig{BlockSize: 4, RejectBlockSize: true})
	require.NoError(t, err)
	evs, err = r.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{page(0, 8, 0)}})
	require.NoError(t, err)
	require.Empty(t, evs)
	require.EqualValues(t, 1, r.Stats().BlockSizeRejects)
	// A chain whose block size changes mid-block cannot be aligned.
	// Tokens 10..12 after the 8, 9 left over: one block, 12 left over at
	// page -1012; then pages of 2 tokens cannot continue from it.
	odd := page(14, 14, -1012)
	odd.BlockSize, odd.TokenIDs = 2, seq(4, 900)
	odd.BlockHashes = []kvevents.Hash{kvevents.IntHash(-3000), kvevents.IntHash(-3001)}
	evs, err = c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{page(10, 13, -1009), odd}})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, kvroute.ExternalHash(^uint64(1010)), evs[0].Blocks[0].External)
	require.EqualValues(t, 1, c.Stats().BlockSizeRejects)
	// A size that does not divide the router's is always rejected.
	ev := page(0, 8, 0)
	ev.BlockSize = 3
	evs, err = c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{ev}})
	require.NoError(t, err)
	require.Empty(t, evs)
	require.EqualValues(t, 2, c.Stats().BlockSizeRejects)
}

// TestConvertEagle decodes SGLang's Eagle bigram pages and hashes Eagle
// windows, as a router with an Eagle hasher hashes the prompt; page size 1
// re-chunks into the router's blocks.
func TestConvertEagle(t *testing.T) {
	toks := seq(9, 200)
	for _, pageSize := range []int{1, 4} {
		b := kvevents.Batch{Events: []kvevents.EngineEvent{{Type: kvevents.BlockStored, Layout: kvevents.LayoutMap,
			BlockSize: pageSize, TokenIDs: toks, Eagle: true}}}
		for i := range 8 / pageSize {
			b.Events[0].BlockHashes = append(b.Events[0].BlockHashes, kvevents.UintHash(uint64(i+1)))
		}
		payload, err := kvevents.AppendBatch(nil, &b)
		require.NoError(t, err)
		var got kvevents.Batch
		require.NoError(t, kvevents.DecodeBatch(payload, &got))
		require.True(t, got.Events[0].Eagle)
		require.Equal(t, toks, got.Events[0].TokenIDs)
		c, err := kvevents.NewConverter(kvevents.ConverterConfig{BlockSize: 4})
		require.NoError(t, err)
		evs, err := c.Convert(nil, &got)
		require.NoError(t, err)
		h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4, Eagle: true})
		want := h.AppendBlockHashes(nil, toks)
		require.Len(t, want, 2)
		require.Len(t, evs, 1)
		require.Len(t, evs[0].Blocks, 2)
		for i := range want {
			require.Equal(t, want[i], evs[0].Blocks[i].Hash, "page size %d", pageSize)
		}
	}
}

func TestParseExtraKeys(t *testing.T) {
	digest := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	sha512 := digest + digest
	dh, _ := kvroute.MMIdentifierHash(digest)
	h512, _ := kvroute.MMIdentifierHash(sha512)
	uh, _ := kvroute.MMIdentifierHash("user-uuid")
	lh, _ := kvroute.MMIdentifierHash("a:" + digest)
	sh, _ := kvroute.MMIdentifierHash("s")
	tests := []struct {
		name  string
		raw   []byte
		lora  string
		child bool // the event has a parent
		salt  string
		mm    [][]uint64
		err   bool
	}{
		{name: "nil", raw: nil},
		{name: "lora then salt", raw: extraKeys([]any{"a", "s"}), lora: "a", salt: "s", mm: [][]uint64{nil}},
		{name: "salt equal to lora", raw: extraKeys([]any{"a", "a"}), lora: "a", salt: "a", mm: [][]uint64{nil}},
		{name: "salt tagged by Dynamo", raw: extraKeys([]any{"a", "dynamo-cache-salt:a"}), lora: "a", salt: "a", mm: [][]uint64{nil}},
		{name: "old bare digest and later bare identifiers", raw: extraKeys([]any{digest, "s"}, []any{"user-uuid"}, nil),
			salt: "s", mm: [][]uint64{{dh}, {uh}, nil}},
		{name: "pairs, numbers ignored", raw: extraKeys([]any{[]any{"user-uuid", 3}, int64(5), true}), mm: [][]uint64{{uh}}},
		// vLLM before 0.19: bare identifiers, the salt after them.
		{name: "old identifier before the salt", raw: extraKeys([]any{"user-uuid", "s"}, []any{"user-uuid"}),
			salt: "s", mm: [][]uint64{{uh}, {uh}}},
		{name: "old identifier running into the next block", raw: extraKeys([]any{"user-uuid"}, []any{"user-uuid"}),
			mm: [][]uint64{{uh}, {uh}}},
		{name: "old sha512 hash", raw: extraKeys([]any{sha512}), mm: [][]uint64{{h512}}},
		{name: "old hash with LoRA prefix", raw: extraKeys([]any{"a", "a:" + digest}), lora: "a", mm: [][]uint64{{lh}}},
		{name: "old identifier in a child event", raw: extraKeys([]any{"user-uuid"}, []any{"user-uuid"}), child: true,
			mm: [][]uint64{{uh}, {uh}}},
		{name: "bare string in a child event", raw: extraKeys([]any{"s"}), child: true, mm: [][]uint64{{sh}}},
		// vLLM 0.19 on: pairs, the salt the one other bare string.
		{name: "salt of hex digits after pairs", raw: extraKeys([]any{[]any{"user-uuid", 0}, digest}, []any{[]any{"user-uuid", -16}}),
			salt: digest, mm: [][]uint64{{uh}, {uh}}},
		{name: "Dynamo salt of hex digits", raw: extraKeys([]any{"dynamo-cache-salt:" + digest}), salt: digest, mm: [][]uint64{nil}},
		{name: "not a list", raw: msgp.AppendString(nil, "x"), err: true},
		{name: "block not a list", raw: extraKeys([]any{}), err: false, mm: [][]uint64{nil}},
		{name: "truncated", raw: extraKeys([]any{"abc"})[:4], err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var x kvevents.ExtraKeys
			err := kvevents.ParseExtraKeys(tt.raw, tt.lora, !tt.child, &x)
			if tt.err {
				require.ErrorIs(t, err, kvevents.ErrMalformed)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.salt, x.Salt)
			require.Len(t, x.MM, len(tt.mm))
			for i := range tt.mm {
				require.ElementsMatch(t, tt.mm[i], x.MM[i])
			}
		})
	}
}

// TestConvertOldExtraKeys: the bare multimodal identifiers of vLLM before
// 0.19 are hashed as items, never as the cache salt, which is read only at
// its place (the last bare string of a root event's first block).
func TestConvertOldExtraKeys(t *testing.T) {
	toks := seq(8, 100)
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	sha512 := strings.Repeat("0123456789abcdef", 8)
	img, _ := kvroute.MMIdentifierHash("img-uuid")
	big, _ := kvroute.MMIdentifierHash(sha512)
	tests := []struct {
		name   string
		parent uint64
		keys   []byte
		salt   string
		mm     [][]uint64 // per block
	}{
		{name: "identifier then salt", keys: extraKeys([]any{"img-uuid", "tenant-a"}, []any{"img-uuid"}),
			salt: "tenant-a", mm: [][]uint64{{img}, {img}}},
		{name: "identifier running on, no salt", keys: extraKeys([]any{"img-uuid"}, []any{"img-uuid"}),
			mm: [][]uint64{{img}, {img}}},
		{name: "sha512 hash, no salt", keys: extraKeys([]any{sha512}, nil), mm: [][]uint64{{big}, nil}},
		{name: "child event", parent: 9, keys: extraKeys([]any{"img-uuid"}, nil), mm: [][]uint64{{img}, nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := kvevents.NewConverter(kvevents.ConverterConfig{BlockSize: 4})
			require.NoError(t, err)
			ev := stored([]uint64{1, 2}, tt.parent, toks)
			ev.ExtraKeys = tt.keys
			evs, err := c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{ev}})
			require.NoError(t, err)
			require.Len(t, evs, 1)
			require.Len(t, evs[0].Blocks, 2)
			hs := h.WithSalt(tt.salt)
			for i, b := range evs[0].Blocks {
				require.Equal(t, hs.HashBlockMM(toks[4*i:4*i+4], tt.mm[i]), b.Hash, "block %d", i)
			}
		})
	}
}

func TestConvertSkipsBlocksNotLocal(t *testing.T) {
	c, err := kvevents.NewConverter(kvevents.ConverterConfig{BlockSize: 4})
	require.NoError(t, err)
	local := stored([]uint64{1}, 0, seq(4, 0))
	local.Locality = "LOCAL"
	remote := stored([]uint64{2}, 0, seq(4, 0))
	remote.Locality = "REMOTE"
	owned := kvevents.EngineEvent{Type: kvevents.BlockRemoved, Ownership: "kvcr", BlockHashes: []kvevents.Hash{kvevents.UintHash(1)}}
	evs, err := c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{local, remote, owned}})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, kvroute.ExternalHash(1), evs[0].Blocks[0].External)
	require.EqualValues(t, 2, c.Stats().NotLocal)
}

// trtllmStore encodes a batch of one BlockStored event as Dynamo's
// TensorRT-LLM publisher (dynamo/trtllm/publisher.py) sends it: a map
// with signed hashes and, when mmInfos is not nil, block_mm_infos.
func trtllmStore(t *testing.T, hashes []int64, tokens []uint32, mmInfos []any) []byte {
	t.Helper()
	p := msgp.AppendArrayHeader(nil, 3)
	p = msgp.AppendFloat64(p, 1757500000)
	p = msgp.AppendArrayHeader(p, 1)
	n := uint32(5)
	if mmInfos != nil {
		n++
	}
	p = msgp.AppendMapHeader(p, n)
	p = msgp.AppendString(msgp.AppendString(p, "type"), "BlockStored")
	p = msgp.AppendArrayHeader(msgp.AppendString(p, "block_hashes"), uint32(len(hashes)))
	for _, h := range hashes {
		p = msgp.AppendInt64(p, h)
	}
	p = msgp.AppendNil(msgp.AppendString(p, "parent_block_hash"))
	p = msgp.AppendArrayHeader(msgp.AppendString(p, "token_ids"), uint32(len(tokens)))
	for _, x := range tokens {
		p = msgp.AppendUint32(p, x)
	}
	p = msgp.AppendInt(msgp.AppendString(p, "block_size"), 4)
	if mmInfos != nil {
		var err error
		p, err = msgp.AppendIntf(msgp.AppendString(p, "block_mm_infos"), mmInfos)
		require.NoError(t, err)
	}
	return msgp.AppendInt(p, 0)
}

// mmInfo is one block's block_mm_infos entry with objects of these hashes.
func mmInfo(hashes ...uint64) map[string]any {
	objs := make([]any, len(hashes))
	for i, h := range hashes {
		objs[i] = map[string]any{"mm_hash": h, "offsets": []any{[]any{0, 2}}}
	}
	return map[string]any{"mm_objects": objs}
}

// TestConvertBlockMMInfos: the block_mm_infos of Dynamo's TensorRT-LLM
// publisher put each block's multimodal objects in its hash as Dynamo
// hashes them (the want values are Dynamo 1.6.1's
// compute_block_hash_for_seq of tokens 100..107, block size 4, with the
// same block_mm_infos), survive a re-encoding, and a malformed one skips
// its event.
func TestConvertBlockMMInfos(t *testing.T) {
	const x = 0xfedcba9876543210
	tokens := []uint32{100, 101, 102, 103, 104, 105, 106, 107}
	tests := []struct {
		name    string
		mmInfos []any
		want    []kvroute.BlockHash // nil: the event is skipped as invalid
	}{
		{"none", nil, []kvroute.BlockHash{6320977984009303047, 16988655349664461655}},
		{"first block", []any{mmInfo(x), nil}, []kvroute.BlockHash{5591260241815581346, 16988655349664461655}},
		{"several and repeated", []any{mmInfo(x, 5), mmInfo(5, 5)}, []kvroute.BlockHash{8565628007924648005, 11348047757358230457}},
		{"mm_hash negative", []any{map[string]any{"mm_objects": []any{map[string]any{"mm_hash": int64(-1)}}}}, nil},
		{"entry not a map", []any{"x"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b, back kvevents.Batch
			require.NoError(t, kvevents.DecodeBatch(trtllmStore(t, []int64{-7, 8}, tokens, tt.mmInfos), &b))
			require.Len(t, b.Events, 1)
			out, err := kvevents.AppendBatch(nil, &b)
			require.NoError(t, err)
			require.NoError(t, kvevents.DecodeBatch(out, &back))
			require.Equal(t, b.Events[0].BlockMMInfos, back.Events[0].BlockMMInfos)
			for _, batch := range []*kvevents.Batch{&b, &back} {
				c, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 1, BlockSize: 4})
				require.NoError(t, err)
				evs, err := c.Convert(nil, batch)
				require.NoError(t, err)
				if tt.want == nil {
					require.Empty(t, evs)
					require.EqualValues(t, 1, c.Stats().InvalidEvents)
					continue
				}
				require.Len(t, evs, 1)
				var got []kvroute.BlockHash
				for _, bl := range evs[0].Blocks {
					got = append(got, bl.Hash)
				}
				require.Equal(t, tt.want, got)
				require.Equal(t, kvroute.ExternalHash(uint64(1<<64-7)), evs[0].Blocks[0].External)
			}
		})
	}
}

// TestConvertTierCopies: vLLM's CPU offloading connector reports a copy
// to the host as a store of block hashes without tokens, parent or block
// size. The Converter stores such copies from what the device stores said
// of their blocks (split where a block it does not know breaks the chain),
// so the index holds the prefix on the host once the device evicts it.
// Without ExpectTierCopies the Converter starts remembering at the first
// copy, whose blocks are then dropped.
func TestConvertTierCopies(t *testing.T) {
	hasher := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	tokens := make([]uint32, 24)
	for i := range tokens {
		tokens[i] = uint32(500 + i)
	}
	hostCopy := func(hashes ...uint64) kvevents.EngineEvent {
		ev := kvevents.EngineEvent{Type: kvevents.BlockStored, Layout: kvevents.LayoutMap, TokenIDs: []uint32{}, Medium: kvevents.MediumCPU}
		for _, h := range hashes {
			ev.BlockHashes = append(ev.BlockHashes, kvevents.UintHash(h))
		}
		return ev
	}
	evict := func(hashes ...uint64) kvevents.EngineEvent {
		ev := kvevents.EngineEvent{Type: kvevents.BlockRemoved, Layout: kvevents.LayoutMap, Medium: kvevents.MediumGPU}
		for _, h := range hashes {
			ev.BlockHashes = append(ev.BlockHashes, kvevents.UintHash(h))
		}
		return ev
	}
	tests := []struct {
		expect bool
		// Host blocks matched for the first chain (tokens 0..11) and the
		// second (tokens 12..23) once the device evicted both.
		first, second int
		dropped       uint64
	}{
		{expect: true, first: 3, second: 2, dropped: 1},
		{expect: false, first: 0, second: 2, dropped: 4},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("expect=%v", tt.expect), func(t *testing.T) {
			ix, err := indexer.New(indexer.Config{Hasher: hasher})
			require.NoError(t, err)
			c, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 5, BlockSize: 4, ExpectTierCopies: tt.expect})
			require.NoError(t, err)
			w := kvroute.WorkerKey{ID: 5}
			batches := [][]kvevents.EngineEvent{
				{stored([]uint64{101, 102, 103}, 0, tokens[:12])},
				// 999 was never on the device: the copy splits around it.
				{hostCopy(101, 102, 999, 103)},
				{stored([]uint64{201, 202}, 0, tokens[12:20])},
				{hostCopy(201, 202)},
				{evict(101, 102, 103, 201, 202)},
			}
			for i, evs := range batches {
				var b kvevents.Batch
				p, err := kvevents.AppendBatch(nil, &kvevents.Batch{Timestamp: 1, Events: evs, RankSlot: true, DPRank: kvevents.Some(0)})
				require.NoError(t, err)
				require.NoError(t, kvevents.DecodeBatch(p, &b))
				out, err := c.Convert(nil, &b)
				require.NoError(t, err)
				for j := range out {
					require.NoError(t, out[j].Validate())
					require.NoError(t, ix.Apply(&out[j]), "batch %d: %s", i, out[j].String())
				}
			}
			st := c.Stats()
			require.EqualValues(t, 2, st.TierCopies)
			require.Equal(t, tt.dropped, st.DroppedBlocks)
			for _, chain := range []struct {
				toks []uint32
				want int
			}{{tokens[:12], tt.first}, {tokens[12:20], tt.second}} {
				var res indexer.MatchResult
				ix.Match(hasher.AppendSeqHashes(nil, chain.toks), &res)
				got := 0
				for _, m := range res.Workers {
					if m.Worker == w {
						got = m.ByTier[kvroute.TierHost]
						require.Equal(t, m.Blocks, got, "blocks held outside the host after the device evicted them")
					}
				}
				require.Equal(t, chain.want, got)
			}
		})
	}
}

// TestConvertSaltsPastTheirBound: the salts a Converter keeps for the
// children of salted blocks are bounded; when the bound is reached (here
// by salted blocks whose removals never arrived) it starts afresh, so that
// the chains stored after it still hash their children under their salt.
func TestConvertSaltsPastTheirBound(t *testing.T) {
	const blocksPerEvent = 4096
	toks := seq(4*blocksPerEvent, 1)
	c, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 1, BlockSize: 4})
	require.NoError(t, err)
	var evs []kvroute.Event
	hashes := make([]uint64, blocksPerEvent)
	for e := range (1 << 20) / blocksPerEvent {
		for i := range hashes {
			hashes[i] = uint64(1<<32 + e*blocksPerEvent + i)
		}
		ev := stored(hashes, 0, toks)
		ev.CacheSalt = "stale"
		evs, err = c.Convert(evs[:0], &kvevents.Batch{Events: []kvevents.EngineEvent{ev}})
		require.NoError(t, err)
	}

	root := stored([]uint64{1}, 0, toks[:4])
	root.ExtraKeys = extraKeys([]any{"tenant-a"})
	child := stored([]uint64{2}, 1, toks[4:8])
	batch := kvevents.Batch{Events: []kvevents.EngineEvent{root, child}}
	fresh, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 1, BlockSize: 4})
	require.NoError(t, err)
	want, err := fresh.Convert(nil, &batch)
	require.NoError(t, err)
	got, err := c.Convert(evs[:0], &batch)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, want[1].Blocks[0].Hash, got[1].Blocks[0].Hash, "the child is hashed under its parent's salt")
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4}).WithSalt("tenant-a")
	require.Equal(t, h.HashBlock(toks[4:8]), got[1].Blocks[0].Hash)
}

// TestConvertSkipsRepeatedHashes: a stored event whose block hashes repeat
// one another or its parent (a block its own ancestor) is skipped and
// counted, as Dynamo drops it, instead of moving the worker's indexed
// blocks of those hashes into a chain that cannot exist; the events
// around it convert.
func TestConvertSkipsRepeatedHashes(t *testing.T) {
	toks := seq(16, 100)
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	w := kvroute.WorkerKey{ID: 1}
	tests := []struct {
		name string
		bad  kvevents.EngineEvent
	}{
		{"its own parent", stored([]uint64{6}, 6, toks[8:12])},
		{"adjacent repeat", stored([]uint64{7, 7}, 6, toks[8:16])},
		{"repeat further on", stored([]uint64{7, 8, 7}, 6, toks[4:16])},
		{"a repeat among many", func() kvevents.EngineEvent {
			hashes := make([]uint64, 64)
			for i := range hashes {
				hashes[i] = uint64(1000 + i)
			}
			hashes[63] = 1010
			return stored(hashes, 0, seq(256, 1))
		}()},
		{"a tier copy repeating a hash", kvevents.EngineEvent{Type: kvevents.BlockStored, Medium: "CPU",
			BlockHashes: []kvevents.Hash{kvevents.UintHash(5), kvevents.UintHash(5)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 1, BlockSize: 4, ExpectTierCopies: true})
			require.NoError(t, err)
			ix, err := indexer.New(indexer.Config{Hasher: h})
			require.NoError(t, err)
			evs, err := c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{stored([]uint64{5, 6}, 0, toks[:8])}})
			require.NoError(t, err)
			applyAll(t, ix, evs)
			require.Equal(t, 2, matchDepth(ix, h.AppendSeqHashes(nil, toks), w))

			next := stored([]uint64{9}, 6, toks[8:12])
			evs, err = c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{tt.bad, next}})
			require.NoError(t, err)
			require.Len(t, evs, 1, "the event after the bad one converts")
			require.Equal(t, kvroute.ExternalHash(9), evs[0].Blocks[0].External)
			applyAll(t, ix, evs)
			require.Equal(t, 3, matchDepth(ix, h.AppendSeqHashes(nil, toks), w))
			st := c.Stats()
			require.EqualValues(t, 1, st.InvalidEvents)
			require.EqualValues(t, 1, st.SkippedEvents)
		})
	}
}

// TestConvertInvalidEventsLogSparingly: a producer whose every batch has
// an invalid event (a field type changed in a new engine version) gets a
// Warn record when invalid events first appear and then each time their
// total doubles, with that total, not one record per batch.
func TestConvertInvalidEventsLogSparingly(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 1, BlockSize: 4, Logger: log})
	require.NoError(t, err)
	b := kvevents.Batch{Invalid: 1, InvalidErr: fmt.Errorf("event 0: %w", kvevents.ErrMalformed),
		Events: []kvevents.EngineEvent{stored([]uint64{1}, 0, seq(4, 0))}}
	for range 1000 {
		_, err := c.Convert(nil, &b)
		require.NoError(t, err)
	}
	require.EqualValues(t, 1000, c.Stats().InvalidEvents)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 10, "totals 1, 2, 4, ..., 512")
	require.Contains(t, lines[0], "total=1 ")
	require.Contains(t, lines[9], "total=512 ")
}

// TestConvertKindsBounded: the kinds learned per (rank, group) are bounded
// by clearing, so a pair first seen after the bound is still learned and
// the kind-less removals of its group are converted.
func TestConvertKindsBounded(t *testing.T) {
	c, err := kvevents.NewConverter(kvevents.ConverterConfig{BlockSize: 4})
	require.NoError(t, err)
	// A store in each of 1,024 sliding-window groups fills the map.
	var fill kvevents.Batch
	for g := range 1024 {
		ev := stored([]uint64{uint64(g + 1)}, 0, seq(4, 0))
		ev.GroupIdx, ev.SpecKind = kvevents.Some(int64(g+1)), kvevents.KindSlidingWindow
		fill.Events = append(fill.Events, ev)
	}
	evs, err := c.Convert(nil, &fill)
	require.NoError(t, err)
	require.Empty(t, evs)
	require.Zero(t, c.Stats().StateClears)

	// A new full-attention group stores, then evicts without its kind.
	st := stored([]uint64{5000}, 0, seq(4, 0))
	st.GroupIdx, st.SpecKind = kvevents.Some(2000), kvevents.KindFullAttention
	rm := kvevents.EngineEvent{Type: kvevents.BlockRemoved, GroupIdx: kvevents.Some(2000),
		BlockHashes: []kvevents.Hash{kvevents.UintHash(5000)}}
	evs, err = c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{st, rm}})
	require.NoError(t, err)
	require.Len(t, evs, 2)
	require.Equal(t, kvroute.EventRemoved, evs[1].Kind)
	require.Equal(t, []kvroute.ExternalHash{5000}, evs[1].Removed)
	require.EqualValues(t, 1, c.Stats().StateClears)

	// A cleared sliding-window group is learned again from its next store.
	again := stored([]uint64{7}, 0, seq(4, 0))
	again.GroupIdx, again.SpecKind = kvevents.Some(7), kvevents.KindSlidingWindow
	rm7 := kvevents.EngineEvent{Type: kvevents.BlockRemoved, GroupIdx: kvevents.Some(7),
		BlockHashes: []kvevents.Hash{kvevents.UintHash(7)}}
	skipped := c.Stats().SkippedGroupEvents
	evs, err = c.Convert(nil, &kvevents.Batch{Events: []kvevents.EngineEvent{again, rm7}})
	require.NoError(t, err)
	require.Empty(t, evs)
	require.Equal(t, skipped+2, c.Stats().SkippedGroupEvents)
}

// TestConvertOwnership follows vLLM 0.33's publishers of the ownership
// field: the engine's own tiers (the device, its CPU offloading tier, a
// local file-system tier) publish none and are converted; KVCR's
// inventory ("kvcr": blocks its own DRAM or storage holds, which it serves
// to peers) is skipped and counted, its removals taking nothing from the
// engine's copies of the same blocks.
func TestConvertOwnership(t *testing.T) {
	toks := seq(4, 0)
	own := func(ev kvevents.EngineEvent, medium, locality, ownership string) kvevents.EngineEvent {
		ev.Medium, ev.Locality, ev.Ownership = medium, locality, ownership
		ev.GroupIdx = kvevents.Some(0)
		return ev
	}
	placeholder := kvevents.EngineEvent{Type: kvevents.BlockStored, Layout: kvevents.LayoutMap,
		BlockHashes: []kvevents.Hash{kvevents.UintHash(1)}, TokenIDs: []uint32{}}
	removed := kvevents.EngineEvent{Type: kvevents.BlockRemoved, Layout: kvevents.LayoutMap,
		BlockHashes: []kvevents.Hash{kvevents.UintHash(1)}}
	batch := kvevents.Batch{Timestamp: 1, RankSlot: true, DPRank: kvevents.Some(0), Events: []kvevents.EngineEvent{
		own(stored([]uint64{1}, 0, toks), kvevents.MediumGPU, "", ""),
		own(stored([]uint64{1}, 0, toks), kvevents.MediumCPU, "", ""),           // self-describing CPU offload
		own(placeholder, kvevents.MediumCPU, "", ""),                            // placeholder CPU offload
		own(stored([]uint64{1}, 0, toks), kvevents.MediumStorage, "LOCAL", ""),  // local file-system tier
		own(stored([]uint64{1}, 0, toks), kvevents.MediumCPU, "", "kvcr"),       // KVCR's DRAM
		own(stored([]uint64{1}, 0, toks), kvevents.MediumStorage, "", "kvcr"),   // KVCR's storage
		own(placeholder, kvevents.MediumCPU, "", "kvcr"),                        // KVCR placeholder
		own(removed, kvevents.MediumCPU, "", "kvcr"),                            // KVCR eviction
		own(stored([]uint64{1}, 0, toks), kvevents.MediumStorage, "REMOTE", ""), // a remote tier
	}}
	payload, err := kvevents.AppendBatch(nil, &batch)
	require.NoError(t, err)
	var got kvevents.Batch
	require.NoError(t, kvevents.DecodeBatch(payload, &got))
	c, err := kvevents.NewConverter(kvevents.ConverterConfig{BlockSize: 4, ExpectTierCopies: true})
	require.NoError(t, err)
	evs, err := c.Convert(nil, &got)
	require.NoError(t, err)
	var tiers []kvroute.Tier
	for _, ev := range evs {
		require.Equal(t, kvroute.EventStored, ev.Kind)
		require.Equal(t, []kvroute.ExternalHash{1}, []kvroute.ExternalHash{ev.Blocks[0].External})
		tiers = append(tiers, ev.Tier)
	}
	require.Equal(t, []kvroute.Tier{kvroute.TierDevice, kvroute.TierHost, kvroute.TierHost, kvroute.TierExternal}, tiers)
	require.EqualValues(t, 5, c.Stats().NotLocal)
	require.EqualValues(t, 1, c.Stats().TierCopies)
}
