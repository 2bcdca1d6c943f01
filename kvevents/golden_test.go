package kvevents_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute/kvevents"
)

// goldenMeaning is the schema of testdata/*.json (see testdata/README.md).
type goldenMeaning struct {
	BatchLayout    string        `json:"batch_layout"`
	EventLayout    string        `json:"event_layout"`
	TS             float64       `json:"ts"`
	DPRank         *int64        `json:"data_parallel_rank"`
	DPRankEncoding string        `json:"dp_rank_encoding"`
	Events         []goldenEvent `json:"events"`
	PayloadLen     int           `json:"payload_len"`
	SHA256         string        `json:"sha256"`
}

type goldenHash struct {
	Wire   string `json:"wire"`
	Value  string `json:"value"`
	KeyU64 string `json:"key_u64"`
}

type goldenEvent struct {
	Type          string       `json:"type"`
	WireFields    []string     `json:"wire_fields"`
	BlockHashes   []goldenHash `json:"block_hashes"`
	Parent        *goldenHash  `json:"parent_block_hash"`
	TokenIDs      []uint32     `json:"token_ids"`
	BlockSize     *int         `json:"block_size"`
	LoRAID        *int64       `json:"lora_id"`
	Medium        *string      `json:"medium"`
	LoRAName      *string      `json:"lora_name"`
	ExtraKeys     any          `json:"extra_keys"`
	GroupIdx      *int64       `json:"group_idx"`
	SpecKind      *string      `json:"kv_cache_spec_kind"`
	SlidingWindow *int64       `json:"kv_cache_spec_sliding_window"`
	Locality      *string      `json:"locality"`
	Ownership     *string      `json:"ownership"`
	SessionID     *string      `json:"session_id"`
	CacheSalt     *string      `json:"cache_salt"`
}

func goldenFiles(t testing.TB) []string {
	files, err := filepath.Glob("testdata/*.msgpack")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return files
}

func readGolden(t *testing.T, path string) ([]byte, goldenMeaning) {
	payload, err := os.ReadFile(path)
	require.NoError(t, err)
	raw, err := os.ReadFile(strings.TrimSuffix(path, ".msgpack") + ".json")
	require.NoError(t, err)
	var m goldenMeaning
	require.NoError(t, json.Unmarshal(raw, &m))
	return payload, m
}

func optInt(v *int64) kvevents.OptInt {
	if v == nil {
		return kvevents.OptInt{}
	}
	return kvevents.Some(*v)
}

func str(v *string) string {
	if v == nil {
		return ""
	}
	return *v
}

func wantHash(t *testing.T, g *goldenHash) kvevents.Hash {
	if g == nil {
		return kvevents.Hash{}
	}
	key, err := strconv.ParseUint(g.KeyU64, 10, 64)
	require.NoError(t, err)
	switch g.Wire {
	case "uint":
		v, err := strconv.ParseUint(g.Value, 10, 64)
		require.NoError(t, err)
		require.Equal(t, key, v)
		return kvevents.UintHash(v)
	case "int":
		v, err := strconv.ParseInt(g.Value, 10, 64)
		require.NoError(t, err)
		require.Equal(t, key, uint64(v))
		return kvevents.IntHash(v)
	case "bytes":
		b, err := hex.DecodeString(g.Value)
		require.NoError(t, err)
		h := kvevents.BytesHash(b)
		require.Equal(t, key, h.Key)
		return h
	}
	t.Fatalf("unknown hash wire %q", g.Wire)
	return kvevents.Hash{}
}

// jsonOfMsgpack turns raw msgpack into the JSON model of the meaning files
// (byte strings as {"bytes_hex": ...}).
func jsonOfMsgpack(t *testing.T, raw []byte) any {
	if raw == nil {
		return nil
	}
	v, rest, err := msgp.ReadIntfBytes(raw)
	require.NoError(t, err)
	require.Empty(t, rest)
	var conv func(any) any
	conv = func(v any) any {
		switch x := v.(type) {
		case []any:
			out := make([]any, len(x))
			for i := range x {
				out[i] = conv(x[i])
			}
			return out
		case []byte:
			return map[string]any{"bytes_hex": hex.EncodeToString(x)}
		case int64:
			return float64(x)
		case uint64:
			return float64(x)
		}
		return v
	}
	return conv(v)
}

func TestGoldenVLLMSGLang(t *testing.T) {
	for _, path := range goldenFiles(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			payload, m := readGolden(t, path)
			sum := sha256.Sum256(payload)
			require.Equal(t, m.SHA256, hex.EncodeToString(sum[:]))
			require.Len(t, payload, m.PayloadLen)

			var b kvevents.Batch
			require.NoError(t, kvevents.DecodeBatch(payload, &b))
			require.Equal(t, m.TS, b.Timestamp)
			require.Zero(t, b.Skipped)
			switch m.DPRankEncoding {
			case "absent":
				require.False(t, b.RankSlot)
				require.False(t, b.DPRank.Valid)
			case "nil":
				require.True(t, b.RankSlot)
				require.False(t, b.DPRank.Valid)
			case "present":
				require.True(t, b.RankSlot)
				require.Equal(t, kvevents.Some(*m.DPRank), b.DPRank)
			default:
				t.Fatalf("dp_rank_encoding %q", m.DPRankEncoding)
			}
			require.Equal(t, m.BatchLayout == "array3", b.RankSlot)

			require.Len(t, b.Events, len(m.Events))
			for i, ge := range m.Events {
				ev := b.Events[i]
				require.Equal(t, ge.Type, ev.Type.String(), "event %d", i)
				if m.EventLayout == "map" {
					require.Equal(t, kvevents.LayoutMap, ev.Layout)
				} else {
					require.Equal(t, kvevents.LayoutArray, ev.Layout)
					require.Equal(t, len(ge.WireFields)-1, ev.Fields, "event %d", i)
				}
				var hashes []kvevents.Hash
				for j := range ge.BlockHashes {
					hashes = append(hashes, wantHash(t, &ge.BlockHashes[j]))
				}
				require.Equal(t, hashes, ev.BlockHashes, "event %d", i)
				require.Equal(t, wantHash(t, ge.Parent), ev.ParentBlockHash, "event %d", i)
				require.Equal(t, ge.TokenIDs, ev.TokenIDs)
				if ge.BlockSize != nil {
					require.Equal(t, *ge.BlockSize, ev.BlockSize)
				} else {
					require.Zero(t, ev.BlockSize)
				}
				require.Equal(t, optInt(ge.LoRAID), ev.LoRAID)
				require.Equal(t, str(ge.Medium), ev.Medium)
				require.Equal(t, str(ge.LoRAName), ev.LoRAName)
				require.Equal(t, ge.ExtraKeys, jsonOfMsgpack(t, ev.ExtraKeys))
				require.Equal(t, optInt(ge.GroupIdx), ev.GroupIdx)
				require.Equal(t, str(ge.SpecKind), ev.SpecKind)
				require.Equal(t, optInt(ge.SlidingWindow), ev.SlidingWindow)
				require.Equal(t, str(ge.Locality), ev.Locality)
				require.Equal(t, str(ge.Ownership), ev.Ownership)
				require.Equal(t, str(ge.SessionID), ev.SessionID)
				require.Equal(t, str(ge.CacheSalt), ev.CacheSalt)
			}

			// Re-encoding reproduces the producer's bytes exactly.
			out, err := kvevents.AppendBatch(nil, &b)
			require.NoError(t, err)
			require.Equal(t, hex.EncodeToString(payload), hex.EncodeToString(out))
		})
	}
}
