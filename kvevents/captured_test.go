package kvevents_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
)

// capturedFile is one engine-format batch captured from a real publisher
// (testdata/captured/capture.py, and capture_dynamo.py for the vLLM-format
// batches of Dynamo's mocker): the payload and msgspec's decoding of it.
type capturedFile struct {
	name     string
	payload  []byte
	Producer string `json:"producer"`
	Batch    []any  `json:"batch"` // [ts, events, rank?]
}

func capturedFiles(t testing.TB) []capturedFile {
	paths, err := filepath.Glob("testdata/captured/*.msgpack")
	require.NoError(t, err)
	var out []capturedFile
	for _, p := range paths {
		payload, err := os.ReadFile(p)
		require.NoError(t, err)
		raw, err := os.ReadFile(strings.TrimSuffix(p, ".msgpack") + ".json")
		require.NoError(t, err)
		f := capturedFile{name: strings.TrimSuffix(filepath.Base(p), ".msgpack"), payload: payload}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&f))
		if f.Batch == nil {
			continue // Dynamo's RouterEvent lists: TestCapturedDynamo
		}
		out = append(out, f)
	}
	require.GreaterOrEqual(t, len(out), 17)
	return out
}

// jsonable renders a msgpack value as capture.py renders msgspec's
// decoding: byte strings as {"bytes": hex}, numbers as JSON numbers.
func jsonable(v any) any {
	switch x := v.(type) {
	case []byte:
		return map[string]any{"bytes": hex.EncodeToString(x)}
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = jsonable(x[i])
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = jsonable(e)
		}
		return out
	case int64:
		return json.Number(fmt.Sprint(x))
	case uint64:
		return json.Number(fmt.Sprint(x))
	case float64:
		return json.Number(strconv.FormatFloat(x, 'f', -1, 64))
	}
	return v
}

func canon(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func hashJSON(h kvevents.Hash) any {
	switch h.Kind {
	case kvevents.HashUint:
		return json.Number(fmt.Sprint(h.Key))
	case kvevents.HashInt:
		return json.Number(fmt.Sprint(h.Int()))
	case kvevents.HashBytes:
		return map[string]any{"bytes": hex.EncodeToString(h.Bytes)}
	}
	return nil
}

func optJSON(v kvevents.OptInt) any {
	if !v.Valid {
		return nil
	}
	return json.Number(fmt.Sprint(v.Value))
}

func strJSON(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func rawJSON(t *testing.T, raw []byte) any {
	if raw == nil {
		return nil
	}
	v, rest, err := msgp.ReadIntfBytes(raw)
	require.NoError(t, err)
	require.Empty(t, rest)
	return jsonable(v)
}

// eventJSON renders a decoded event as msgspec's decoding of the wire
// event: every field the event had on the wire (map layout: the keys that
// were present; nil-valued fields appear as null only if sent).
func eventJSON(t *testing.T, ev *kvevents.EngineEvent, keys map[string]any) map[string]any {
	all := eventFields(t, ev)
	out := map[string]any{}
	for k := range keys {
		v, ok := all[k]
		require.True(t, ok, "field %q unknown to the decoder", k)
		out[k] = v
	}
	for k, v := range all {
		if _, sent := keys[k]; !sent && v != nil && k != "token_ids" && k != "block_hashes" {
			t.Errorf("field %q set but not on the wire", k)
		}
	}
	return out
}

// eventFields renders every field of a decoded event by its wire name,
// nil for unset ones.
func eventFields(t *testing.T, ev *kvevents.EngineEvent) map[string]any {
	toks := make([]any, 0, len(ev.TokenIDs))
	if ev.Eagle {
		for i := 0; i+1 < len(ev.TokenIDs); i++ {
			toks = append(toks, []any{json.Number(fmt.Sprint(ev.TokenIDs[i])), json.Number(fmt.Sprint(ev.TokenIDs[i+1]))})
		}
	} else {
		for _, x := range ev.TokenIDs {
			toks = append(toks, json.Number(fmt.Sprint(x)))
		}
	}
	hashes := make([]any, len(ev.BlockHashes))
	for i, h := range ev.BlockHashes {
		hashes[i] = hashJSON(h)
	}
	all := map[string]any{
		"type":                         ev.Type.String(),
		"block_hashes":                 hashes,
		"parent_block_hash":            hashJSON(ev.ParentBlockHash),
		"token_ids":                    toks,
		"block_size":                   json.Number(fmt.Sprint(ev.BlockSize)),
		"lora_id":                      optJSON(ev.LoRAID),
		"medium":                       strJSON(ev.Medium),
		"lora_name":                    strJSON(ev.LoRAName),
		"extra_keys":                   rawJSON(t, ev.ExtraKeys),
		"group_idx":                    optJSON(ev.GroupIdx),
		"kv_cache_spec_kind":           strJSON(ev.SpecKind),
		"kv_cache_spec_sliding_window": optJSON(ev.SlidingWindow),
		"locality":                     strJSON(ev.Locality),
		"ownership":                    strJSON(ev.Ownership),
		"session_id":                   strJSON(ev.SessionID),
		"cache_salt":                   strJSON(ev.CacheSalt),
		"lookahead_token_ids":          rawJSON(t, ev.LookaheadTokenIDs),
		"block_mm_infos":               rawJSON(t, ev.BlockMMInfos),
	}
	if ev.Type != kvevents.BlockStored {
		all["block_size"] = nil
	}
	return all
}

// arrayEventJSON renders a decoded array-layout event as msgspec's
// decoding of it: [tag, fields in declaration order...], SGLang's salt
// metadata as the map it came as.
func arrayEventJSON(t *testing.T, ev *kvevents.EngineEvent) []any {
	named := eventFields(t, ev)
	names := []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
		"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	if ev.Type == kvevents.BlockRemoved {
		names = []string{"block_hashes", "medium", "group_idx"}
	}
	require.LessOrEqual(t, ev.Fields, len(names))
	out := []any{ev.Type.String()}
	for _, name := range names[:ev.Fields] {
		v := named[name]
		if name == "lora_name" && ev.SaltMetadata {
			v = map[string]any{"cache_salt": ev.CacheSalt}
		}
		out = append(out, v)
	}
	for _, name := range append(names[ev.Fields:], "locality", "ownership", "session_id", "lookahead_token_ids", "block_mm_infos") {
		require.Nil(t, named[name], "field %q set but not on the wire", name)
	}
	if !ev.SaltMetadata {
		require.Nil(t, named["cache_salt"], "cache_salt set but not on the wire")
	}
	return out
}

func batchJSON(t *testing.T, b *kvevents.Batch, want []any) []any {
	evs := want[1].([]any)
	require.Len(t, b.Events, len(evs))
	out := []any{json.Number(strconv.FormatFloat(b.Timestamp, 'f', -1, 64)), make([]any, len(evs))}
	for i := range b.Events {
		if _, array := evs[i].([]any); array {
			out[1].([]any)[i] = arrayEventJSON(t, &b.Events[i])
			continue
		}
		out[1].([]any)[i] = eventJSON(t, &b.Events[i], evs[i].(map[string]any))
	}
	if b.RankSlot {
		out = append(out, optJSON(b.DPRank))
	}
	return out
}

// TestCapturedGoldenDecodeExactly decodes every captured batch and checks
// every field against msgspec's decoding of the same bytes; re-encoding
// gives the same batch, and for vLLM (whose key order and defaults kvroute
// follows) and SGLang's array layout the same bytes.
func TestCapturedGoldenDecodeExactly(t *testing.T) {
	files := capturedFiles(t)
	var names []string
	for _, f := range files {
		names = append(names, f.name)
	}
	// Dynamo's mocker publishes vLLM's format: its batches are checked too
	// (equal values; rmp_serde's bytes are not msgspec's).
	require.Subset(t, names, []string{"dynamo161_mocker_vllm_prompt", "dynamo161_mocker_vllm_output", "vllm033_int_hashes_dp0", "sglang0523_salt_dp0"})
	for _, f := range files {
		t.Run(f.name, func(t *testing.T) {
			var b kvevents.Batch
			require.NoError(t, kvevents.DecodeBatch(f.payload, &b))
			require.Zero(t, b.Skipped)
			want := jsonable(f.Batch)
			require.Equal(t, canon(t, want), canon(t, batchJSON(t, &b, f.Batch)))

			again, err := kvevents.AppendBatch(nil, &b)
			require.NoError(t, err)
			var b2 kvevents.Batch
			require.NoError(t, kvevents.DecodeBatch(again, &b2))
			require.Equal(t, canon(t, want), canon(t, batchJSON(t, &b2, f.Batch)))
			// vLLM's batches and SGLang's array-layout ones re-encode
			// byte for byte.
			if strings.HasPrefix(f.name, "vllm") || strings.HasPrefix(f.name, "sglang0519") {
				require.Equal(t, f.payload, again, "bytes re-encode exactly")
			}
		})
	}
}

// ingestCaptured converts the first n events of a captured file (all when
// n < 0) with cfg and applies them to a fresh index.
func ingestCaptured(t *testing.T, f capturedFile, cfg kvevents.ConverterConfig, n int) (*indexer.Index, *kvevents.Converter) {
	t.Helper()
	var b kvevents.Batch
	require.NoError(t, kvevents.DecodeBatch(f.payload, &b))
	if n >= 0 {
		b.Events = b.Events[:n]
	}
	c, err := kvevents.NewConverter(cfg)
	require.NoError(t, err)
	evs, err := c.Convert(nil, &b)
	require.NoError(t, err)
	ix, err := indexer.New(indexer.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: c.BlockSize()})})
	require.NoError(t, err)
	for i := range evs {
		require.NoError(t, ix.Apply(&evs[i]), evs[i].String())
	}
	return ix, c
}

// storedTokens concatenates the token ids of the first n stored events
// (with Eagle pairs, the firsts and the last second).
func storedTokens(t *testing.T, f capturedFile, n int) []uint32 {
	var b kvevents.Batch
	require.NoError(t, kvevents.DecodeBatch(f.payload, &b))
	var out []uint32
	for _, ev := range b.Events {
		if ev.Type != kvevents.BlockStored || n == 0 {
			continue
		}
		n--
		if ev.Eagle && len(out) > 0 {
			out = out[:len(out)-1]
		}
		out = append(out, ev.TokenIDs...)
	}
	return out
}

// TestCapturedGoldenConvert checks what the captured batches mean to the
// router: the prompt the events came from, hashed as router.Request hashes
// it (salt, LoRA, images, Eagle), matches every block, and the same tokens
// without the distinguishing input match nothing.
func TestCapturedGoldenConvert(t *testing.T) {
	files := map[string]capturedFile{}
	for _, f := range capturedFiles(t) {
		files[f.name] = f
	}
	bs16 := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})
	bs4 := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	imgA, _ := kvroute.MMIdentifierHash("84127d9feb9345703f2ea1ce0c14f6dfb935b8b04816230d160f03922c94ff31")
	tests := []struct {
		file    string
		cfg     kvevents.ConverterConfig
		events  int // events to apply, -1 for all
		stored  int // stored events whose tokens make the prompt
		hasher  kvroute.Hasher
		mm      func(t *testing.T) []kvroute.MMObject
		worker  kvroute.WorkerKey
		depth   int
		without kvroute.Hasher // the same prompt without what sets it apart
		check   func(t *testing.T, c *kvevents.Converter)
	}{
		{file: "vllm033_int_hashes_dp0", events: 2, stored: 2, hasher: bs16, depth: 4},
		{file: "vllm033_int_hashes_dp0", events: -1, stored: 2, hasher: bs16, depth: 0},
		{file: "vllm033_bytes_hashes_dp0", events: -1, stored: 1, hasher: bs16, depth: 2},
		{file: "vllm033_lora_dp0", events: -1, stored: 1, hasher: bs16.WithLoRA("adapter-a"), depth: 2, without: bs16},
		{file: "vllm033_salt_dp0", events: -1, stored: 2, hasher: bs16.WithSalt("tenant-a"), depth: 3, without: bs16,
			check: func(t *testing.T, c *kvevents.Converter) { require.EqualValues(t, 2, c.Stats().Salted) }},
		{file: "vllm033_multimodal_dp0", events: -1, stored: 1, hasher: bs16, depth: 4, without: bs16,
			mm: func(t *testing.T) []kvroute.MMObject {
				imgB, _ := kvroute.MMIdentifierHash(firstMMIdentifier(t, files["vllm033_multimodal_dp0"], 1))
				return []kvroute.MMObject{{Hash: imgA, Offset: 5, Length: 20}, {Hash: imgB, Offset: 30, Length: 10}}
			}},
		{file: "vllm033_cpu_offload_dp0", events: 1, stored: 1, hasher: bs16, depth: 2},
		{file: "vllm033_cpu_offload_dp0", events: -1, stored: 1, hasher: bs16, depth: 1},
		{file: "vllm033_hybrid_groups_dp0", events: -1, stored: 1, hasher: bs16, depth: 6,
			check: func(t *testing.T, c *kvevents.Converter) {
				require.EqualValues(t, 2, c.Stats().SkippedGroupEvents)
				require.EqualValues(t, 9, c.Stats().SkippedGroupBlocks)
			}},
		{file: "vllm033_dp1", events: -1, stored: 1, hasher: bs16, depth: 2, worker: kvroute.WorkerKey{Rank: 1}},
		{file: "vllm033_dp2", events: -1, stored: 1, hasher: bs16, depth: 2, worker: kvroute.WorkerKey{Rank: 2}},
		{file: "sglang0523_page1_dp3", cfg: kvevents.ConverterConfig{BlockSize: 4}, events: 1, stored: 1, hasher: bs4, depth: 2,
			worker: kvroute.WorkerKey{Rank: 3},
			check:  func(t *testing.T, c *kvevents.Converter) { require.EqualValues(t, 1, c.Stats().Rechunked) }},
		{file: "sglang0523_page1_dp3", cfg: kvevents.ConverterConfig{BlockSize: 4}, events: -1, stored: 1, hasher: bs4, depth: 0,
			worker: kvroute.WorkerKey{Rank: 3}},
		{file: "sglang0523_page4_dp0", cfg: kvevents.ConverterConfig{BlockSize: 4}, events: -1, stored: 2, hasher: bs4, depth: 4},
		{file: "sglang0523_eagle_page1_dp0", cfg: kvevents.ConverterConfig{BlockSize: 4}, events: -1, stored: 1,
			hasher: bs4.WithEagle(true), depth: 2, without: bs4},
		{file: "sglang0523_eagle_page4_dp0", cfg: kvevents.ConverterConfig{BlockSize: 4}, events: -1, stored: 1,
			hasher: bs4.WithEagle(true), depth: 2, without: bs4},
		{file: "sglang0523_salt_dp0", cfg: kvevents.ConverterConfig{BlockSize: 4}, events: -1, stored: 1,
			hasher: bs4.WithSalt("tenant-a"), depth: 2, without: bs4},
		{file: "sglang0523_dynamo_format_dp0", cfg: kvevents.ConverterConfig{BlockSize: 4}, events: 1, stored: 1,
			hasher: bs4.WithLoRA("adapter-a").WithSalt("tenant-a"), depth: 2, without: bs4.WithSalt("tenant-a")},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%d", tt.file, tt.events), func(t *testing.T) {
			f, ok := files[tt.file]
			require.True(t, ok)
			ix, c := ingestCaptured(t, f, tt.cfg, tt.events)
			toks := storedTokens(t, f, tt.stored)
			var mm []kvroute.MMObject
			if tt.mm != nil {
				mm = tt.mm(t)
			}
			require.Equal(t, tt.depth, matchDepth(ix, tt.hasher.AppendSeqHashesMM(nil, toks, mm), tt.worker))
			if tt.without.Valid() {
				require.Zero(t, matchDepth(ix, tt.without.AppendSeqHashes(nil, toks), tt.worker))
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

// firstMMIdentifier returns the identifier of the n-th distinct
// multimodal item in a captured file's first event.
func firstMMIdentifier(t *testing.T, f capturedFile, n int) string {
	var b kvevents.Batch
	require.NoError(t, kvevents.DecodeBatch(f.payload, &b))
	v, _, err := msgp.ReadIntfBytes(b.Events[0].ExtraKeys)
	require.NoError(t, err)
	var ids []string
	for _, blk := range v.([]any) {
		keys, _ := blk.([]any)
		for _, k := range keys {
			id := k.([]any)[0].(string)
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	require.Greater(t, len(ids), n)
	return ids[n]
}

// TestConvertAllocatesNothing: decoding and converting a batch allocates
// nothing in steady state, skipped hybrid groups, salts and re-chunking
// included.
func TestConvertAllocatesNothing(t *testing.T) {
	files := map[string]capturedFile{}
	for _, f := range capturedFiles(t) {
		files[f.name] = f
	}
	for _, tt := range []struct {
		file string
		bs   int
	}{{"vllm033_int_hashes_dp0", 16}, {"vllm033_hybrid_groups_dp0", 16}, {"sglang0523_salt_dp0", 4}, {"sglang0523_page4_dp0", 4}, {"sglang0523_eagle_page1_dp0", 4}, {"sglang0523_page1_dp3", 4}, {"sglang0523_eagle_page4_dp0", 4}, {"vllm033_multimodal_dp0", 16}, {"vllm033_salt_dp0", 16}, {"vllm033_lora_dp0", 16}} {
		t.Run(tt.file, func(t *testing.T) {
			c, err := kvevents.NewConverter(kvevents.ConverterConfig{BlockSize: tt.bs})
			require.NoError(t, err)
			var b kvevents.Batch
			var evs []kvroute.Event
			payload := files[tt.file].payload
			run := func() {
				if err := kvevents.DecodeBatch(payload, &b); err != nil {
					t.Fatal(err)
				}
				if evs, err = c.Convert(evs[:0], &b); err != nil {
					t.Fatal(err)
				}
			}
			run()
			require.NotEmpty(t, evs)
			require.Zero(t, testing.AllocsPerRun(50, run))
		})
	}
}

// TestCapturedDynamo decodes the RouterEvent lists captured from Dynamo
// 1.6.1's KvEventPublisher on its ZMQ event plane, checks every field
// against their decoding, re-encodes them byte for byte, and checks that
// the tokens_hash Dynamo computed (cache salt, Eagle window, LoRA and
// multimodal item) is the hash kvroute's Hasher gives the same input.
func TestCapturedDynamo(t *testing.T) {
	h4 := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	seqTokens := func(from, n uint32) []uint32 { return seq(n, from) }
	want := map[string][]kvroute.BlockHash{
		"dynamo161_stored_salt":    h4.WithSalt("tenant-a").AppendBlockHashes(nil, seqTokens(100, 8)),
		"dynamo161_stored_eagle":   h4.WithEagle(true).AppendBlockHashes(nil, seqTokens(108, 5)),
		"dynamo161_stored_lora_mm": {h4.WithLoRA("adapter-a").HashBlockMM([]uint32{200, 201, 202, 203}, []uint64{81985529216486895})},
		"dynamo161_removed":        nil,
	}
	for name, hashes := range want {
		t.Run(name, func(t *testing.T) {
			payload, err := os.ReadFile("testdata/captured/" + name + ".msgpack")
			require.NoError(t, err)
			raw, err := os.ReadFile("testdata/captured/" + name + ".json")
			require.NoError(t, err)
			var meta struct {
				RouterEvents []json.RawMessage `json:"router_events"`
			}
			require.NoError(t, json.Unmarshal(raw, &meta))
			n, p, err := msgp.ReadArrayHeaderBytes(payload)
			require.NoError(t, err)
			require.EqualValues(t, len(meta.RouterEvents), n)
			var again []byte
			again = msgp.AppendArrayHeader(again, n)
			for i := range int(n) {
				var d kvevents.DynamoEvent
				p, err = kvevents.DecodeDynamoEvent(p, &d)
				require.NoError(t, err)
				// The same event from Dynamo's JSON rendering of the bytes.
				var fromJSON kvevents.DynamoEvent
				require.NoError(t, json.Unmarshal(meta.RouterEvents[i], &fromJSON))
				require.Equal(t, fromJSON, d)
				if hashes != nil {
					require.Len(t, d.Blocks, len(hashes))
					for j := range hashes {
						require.Equal(t, uint64(hashes[j]), d.Blocks[j].TokensHash, "block %d", j)
					}
				}
				again, err = kvevents.AppendDynamoEvent(again, &d)
				require.NoError(t, err)
			}
			require.Empty(t, p)
			require.Equal(t, payload, again)
		})
	}
}
