package kvevents_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
)

// positionalStore appends an array-layout BlockStored as SGLang 0.5.18 and
// 0.5.19 encode it (msgspec array_like, tag first): block_hashes,
// parent_block_hash, token_ids, block_size, lora_id (nil), medium, and,
// when meta is not nil, BlockStoredWithMetadata's metadata struct, which
// msgspec writes as a map. meta is appended as is (a msgpack value).
func positionalStore(dst []byte, hashes []int64, parent int64, tokens []uint32, meta []byte) []byte {
	n := uint32(7)
	if meta != nil {
		n = 8
	}
	dst = msgp.AppendArrayHeader(dst, n)
	dst = msgp.AppendString(dst, "BlockStored")
	dst = msgp.AppendArrayHeader(dst, uint32(len(hashes)))
	for _, h := range hashes {
		dst = msgp.AppendInt64(dst, h)
	}
	if parent == 0 {
		dst = msgp.AppendNil(dst)
	} else {
		dst = msgp.AppendInt64(dst, parent)
	}
	dst = msgp.AppendArrayHeader(dst, uint32(len(tokens)))
	for _, t := range tokens {
		dst = msgp.AppendUint32(dst, t)
	}
	dst = msgp.AppendInt(dst, 4)
	dst = msgp.AppendNil(dst)
	dst = msgp.AppendString(dst, "GPU")
	return append(dst, meta...)
}

// saltMap is BlockStoredMetadata as msgspec writes it: {"cache_salt": salt}.
func saltMap(salt string) []byte {
	b := msgp.AppendMapHeader(nil, 1)
	b = msgp.AppendString(b, "cache_salt")
	return msgp.AppendString(b, salt)
}

// TestDecodeSGLangPositionalSalt: SGLang 0.5.18/0.5.19 publish a salted
// store as an 8-element array whose last element is the map
// {"cache_salt": salt} (where vLLM's lora_name would be). Such a batch
// decodes, with its unsalted stores intact, re-encodes byte for byte, and
// its salted blocks are indexed as the router hashes the salted prompt.
func TestDecodeSGLangPositionalSalt(t *testing.T) {
	toks := seq(16, 100)
	payload := msgp.AppendArrayHeader(nil, 3)
	payload = msgp.AppendFloat64(payload, 1.5)
	payload = msgp.AppendArrayHeader(payload, 4)
	payload = positionalStore(payload, []int64{1, 2}, 0, toks[:8], nil)
	payload = positionalStore(payload, []int64{-11, 12}, 0, toks[:8], saltMap("tenant-a"))
	payload = positionalStore(payload, []int64{3, 4}, 2, toks[8:], nil)
	payload = positionalStore(payload, []int64{13, 14}, 12, toks[8:], saltMap("tenant-a"))
	payload = msgp.AppendInt(payload, 0)

	var b kvevents.Batch
	require.NoError(t, kvevents.DecodeBatch(payload, &b))
	require.Len(t, b.Events, 4)
	for i, ev := range b.Events {
		salted := i%2 == 1
		require.Equal(t, kvevents.BlockStored, ev.Type, i)
		require.Equal(t, salted, ev.SaltMetadata, i)
		require.Equal(t, map[bool]string{true: "tenant-a"}[salted], ev.CacheSalt, i)
		require.Equal(t, map[bool]int{false: kvevents.StoredFieldsMedium, true: kvevents.StoredFieldsMedium + 1}[salted], ev.Fields, i)
		require.Empty(t, ev.LoRAName, i)
		require.Equal(t, "GPU", ev.Medium, i)
		require.Len(t, ev.BlockHashes, 2, i)
	}
	require.Equal(t, kvevents.IntHash(-11), b.Events[1].BlockHashes[0])

	out, err := kvevents.AppendBatch(nil, &b)
	require.NoError(t, err)
	require.Equal(t, payload, out, "re-encoded byte for byte")

	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	c, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 1, BlockSize: 4})
	require.NoError(t, err)
	evs, err := c.Convert(nil, &b)
	require.NoError(t, err)
	ix, err := indexer.New(indexer.Config{Hasher: h})
	require.NoError(t, err)
	applyAll(t, ix, evs)
	w := kvroute.WorkerKey{ID: 1}
	require.Equal(t, 4, matchDepth(ix, h.AppendSeqHashes(nil, toks), w), "unsalted chain")
	require.Equal(t, 4, matchDepth(ix, h.WithSalt("tenant-a").AppendSeqHashes(nil, toks), w), "salted chain")
	require.Equal(t, 0, matchDepth(ix, h.WithSalt("tenant-b").AppendSeqHashes(nil, toks), w), "another salt")
}

// TestDecodeSaltMetadataForms: the metadata map's other keys are skipped
// (as Dynamo skips them), a nil salt is no salt, and a map anywhere it is
// not SGLang's metadata, or a broken one, is rejected.
func TestDecodeSaltMetadataForms(t *testing.T) {
	toks := seq(4, 1)
	meta := func(kv ...any) []byte {
		b := msgp.AppendMapHeader(nil, uint32(len(kv)/2))
		for _, v := range kv {
			var err error
			if b, err = msgp.AppendIntf(b, v); err != nil {
				panic(err)
			}
		}
		return b
	}
	batch := func(event []byte) []byte {
		p := msgp.AppendArrayHeader(nil, 2)
		p = msgp.AppendFloat64(p, 1)
		p = msgp.AppendArrayHeader(p, 1)
		return append(p, event...)
	}
	mapLayoutLoRAMap := msgp.AppendMapHeader(nil, 2)
	mapLayoutLoRAMap = msgp.AppendString(mapLayoutLoRAMap, "type")
	mapLayoutLoRAMap = msgp.AppendString(mapLayoutLoRAMap, "BlockStored")
	mapLayoutLoRAMap = msgp.AppendString(mapLayoutLoRAMap, "lora_name")
	mapLayoutLoRAMap = append(mapLayoutLoRAMap, saltMap("x")...)

	tests := []struct {
		name    string
		payload []byte
		salt    string
		err     bool
	}{
		{"salt and other keys", batch(positionalStore(nil, []int64{1}, 0, toks, meta("session_id", "s1", "cache_salt", "t", "x", []any{1, 2}))), "t", false},
		{"nil salt", batch(positionalStore(nil, []int64{1}, 0, toks, meta("cache_salt", nil))), "", false},
		{"empty map", batch(positionalStore(nil, []int64{1}, 0, toks, meta())), "", false},
		{"salt not a string", batch(positionalStore(nil, []int64{1}, 0, toks, meta("cache_salt", 7))), "", true},
		{"key not a string", batch(positionalStore(nil, []int64{1}, 0, toks, meta(1, "t"))), "", true},
		{"truncated map", batch(positionalStore(nil, []int64{1}, 0, toks, msgp.AppendMapHeader(nil, 3))), "", true},
		{"map as lora_name of a map-layout event", batch(mapLayoutLoRAMap), "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b kvevents.Batch
			err := kvevents.DecodeBatch(tt.payload, &b)
			if tt.err {
				if err == nil { // the event alone is skipped as invalid
					require.Equal(t, 1, b.Invalid)
					require.Empty(t, b.Events)
					err = b.InvalidErr
				}
				require.ErrorIs(t, err, kvevents.ErrMalformed)
				return
			}
			require.NoError(t, err)
			require.Len(t, b.Events, 1)
			require.True(t, b.Events[0].SaltMetadata)
			require.Equal(t, tt.salt, b.Events[0].CacheSalt)
			// Re-encoded, the event keeps its salt.
			out, err := kvevents.AppendBatch(nil, &b)
			require.NoError(t, err)
			var back kvevents.Batch
			require.NoError(t, kvevents.DecodeBatch(out, &back))
			require.Equal(t, b.Events[0].CacheSalt, back.Events[0].CacheSalt)
			require.True(t, back.Events[0].SaltMetadata)
		})
	}
}

// TestCapturedSGLangPositionalSalt: the batch SGLang 0.5.19's own recorder
// and publisher sent for an unsalted chain, the same tokens salted and an
// eviction of the salted child indexes both chains: the unsalted prompt
// matches its 3 blocks, the salted one its 2 remaining blocks (as the
// router hashes a request with that salt), another salt nothing.
func TestCapturedSGLangPositionalSalt(t *testing.T) {
	var f capturedFile
	for _, c := range capturedFiles(t) {
		if c.name == "sglang0519_salt_positional_dp0" {
			f = c
		}
	}
	require.NotNil(t, f.payload, "capture present")
	ix, c := ingestCaptured(t, f, kvevents.ConverterConfig{BlockSize: 4}, -1)
	toks := seq(12, 600)
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	w := kvroute.WorkerKey{}
	require.Equal(t, 3, matchDepth(ix, h.AppendSeqHashes(nil, toks), w), "unsalted chain")
	require.Equal(t, 2, matchDepth(ix, h.WithSalt("tenant-a").AppendSeqHashes(nil, toks), w), "salted chain after its child's eviction")
	require.Zero(t, matchDepth(ix, h.WithSalt("tenant-b").AppendSeqHashes(nil, toks), w), "another salt")
	require.EqualValues(t, 1, c.Stats().Salted)
}
