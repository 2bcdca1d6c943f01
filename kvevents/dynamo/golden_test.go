package dynamo_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/dynamo"
)

// capturedDir holds the frames captured from Dynamo's own publishers by
// kvevents/testdata/captured/capture_dynamo.py.
const capturedDir = "../testdata/captured"

// golden is one captured event-plane message and what it decodes to.
type golden struct {
	name   string
	frames [][]byte
	meta   struct {
		Topic          string          `json:"topic"`
		PublisherID    uint64          `json:"publisher_id"`
		Seq            uint64          `json:"seq"`
		FrameVersion   byte            `json:"frame_version"`
		EnvelopeLength int             `json:"envelope_length"`
		Envelope       goldenEnvelope  `json:"envelope"`
		Payload        json.RawMessage `json:"payload"`
	}
}

type goldenEnvelope struct {
	PublisherID uint64 `json:"publisher_id"`
	Sequence    uint64 `json:"sequence"`
	PublishedAt uint64 `json:"published_at"`
	Topic       string `json:"topic"`
}

func readGolden(t testing.TB) []golden {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(capturedDir, "*.frames"))
	require.NoError(t, err)
	require.NotEmpty(t, paths)
	var out []golden
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		n, rest, err := msgp.ReadArrayHeaderBytes(raw)
		require.NoError(t, err)
		g := golden{name: strings.TrimSuffix(filepath.Base(p), ".frames")}
		for range n {
			var f []byte
			f, rest, err = msgp.ReadBytesBytes(rest, nil)
			require.NoError(t, err)
			g.frames = append(g.frames, f)
		}
		require.Empty(t, rest)
		js, err := os.ReadFile(strings.TrimSuffix(p, ".frames") + ".json")
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(js, &g.meta), g.name)
		out = append(out, g)
	}
	return out
}

// TestGoldenFrames decodes every captured message and checks each field
// against what Dynamo's publisher put in it, then encodes it back to the
// same bytes.
func TestGoldenFrames(t *testing.T) {
	topics := make(map[string]int)
	for _, g := range readGolden(t) {
		t.Run(g.name, func(t *testing.T) {
			var m dynamo.Message
			require.NoError(t, dynamo.DecodeZMQ(g.frames, &m))
			require.Equal(t, g.meta.Topic, m.Topic)
			require.Equal(t, g.meta.PublisherID, m.PublisherID)
			require.Equal(t, g.meta.Seq, m.Sequence)
			require.Equal(t, byte(dynamo.FrameVersion), g.meta.FrameVersion)
			require.Len(t, g.frames[3], dynamo.FrameHeaderSize+g.meta.EnvelopeLength)
			e := m.Envelope
			require.Equal(t, g.meta.Envelope, goldenEnvelope{e.PublisherID, e.Sequence, e.PublishedAt, e.Topic})
			topics[m.Topic]++

			// Byte for byte as Dynamo's ZMQ transport sends it.
			require.Equal(t, g.frames, dynamo.AppendZMQ(&e))

			switch m.Topic {
			case dynamo.TopicKVEvents:
				got, err := dynamo.DecodeRouterEvents(nil, e.Payload)
				require.NoError(t, err)
				var raws []json.RawMessage
				require.NoError(t, json.Unmarshal(g.meta.Payload, &raws))
				require.Len(t, got, len(raws))
				for i, raw := range raws {
					var want kvevents.DynamoEvent
					require.NoError(t, json.Unmarshal(raw, &want))
					require.Equal(t, normalize(want), normalize(got[i]), "event %d", i)
				}
				back, err := dynamo.AppendRouterEvents(nil, got)
				require.NoError(t, err)
				require.Equal(t, e.Payload, back)
			case dynamo.TopicKVMetrics:
				var l dynamo.ActiveLoad
				require.NoError(t, dynamo.DecodeActiveLoad(e.Payload, &l))
				var want struct {
					WorkerID            uint64  `json:"worker_id"`
					DPRank              uint32  `json:"dp_rank"`
					ActiveDecodeBlocks  *uint64 `json:"active_decode_blocks"`
					ActivePrefillTokens *uint64 `json:"active_prefill_tokens"`
					KVUsedBlocks        *uint64 `json:"kv_used_blocks"`
				}
				require.NoError(t, json.Unmarshal(g.meta.Payload, &want))
				require.Equal(t, dynamo.ActiveLoad{
					WorkerID: want.WorkerID, DPRank: want.DPRank,
					ActiveDecodeBlocks: opt(want.ActiveDecodeBlocks), ActivePrefillTokens: opt(want.ActivePrefillTokens),
					KVUsedBlocks: opt(want.KVUsedBlocks),
				}, l)
				require.Equal(t, e.Payload, dynamo.AppendActiveLoad(nil, &l))
			case dynamo.TopicForwardPassMetrics:
				var fpm dynamo.ForwardPassMetrics
				require.NoError(t, dynamo.DecodeForwardPassMetrics(e.Payload, &fpm))
				var want struct {
					Version   uint32      `json:"version"`
					WorkerID  json.Number `json:"worker_id"`
					DPRank    uint32      `json:"dp_rank"`
					CounterID uint64      `json:"counter_id"`
					WallTime  float64     `json:"wall_time"`
					Scheduled goldenStats `json:"scheduled_requests"`
					Queued    goldenStats `json:"queued_requests"`
				}
				require.NoError(t, json.Unmarshal(g.meta.Payload, &want))
				require.Equal(t, string(want.WorkerID), strconv.FormatUint(fpm.WorkerID, 10))
				require.Equal(t, dynamo.ForwardPassMetrics{
					Version: want.Version, WorkerID: fpm.WorkerID, DPRank: want.DPRank, CounterID: want.CounterID,
					WallTime: want.WallTime, Scheduled: want.Scheduled.stats(), Queued: want.Queued.stats(),
				}, fpm)
				require.Equal(t, e.Payload, dynamo.AppendForwardPassMetrics(nil, &fpm))
			default:
				t.Fatalf("unexpected topic %q", m.Topic)
			}
		})
	}
	// Every topic the subscriber reads has golden frames.
	for _, topic := range []string{dynamo.TopicKVEvents, dynamo.TopicKVMetrics, dynamo.TopicForwardPassMetrics} {
		require.NotZero(t, topics[topic], topic)
	}
}

type goldenStats struct {
	NumPrefill        uint64  `json:"num_prefill_requests"`
	SumPrefill        uint64  `json:"sum_prefill_tokens"`
	VarPrefill        float64 `json:"var_prefill_length"`
	SumPrefillKV      uint64  `json:"sum_prefill_kv_tokens"`
	NumDecode         uint64  `json:"num_decode_requests"`
	SumDecodeKV       uint64  `json:"sum_decode_kv_tokens"`
	VarDecodeKVTokens float64 `json:"var_decode_kv_tokens"`
}

func (g goldenStats) stats() dynamo.RequestStats {
	return dynamo.RequestStats{
		PrefillRequests: g.NumPrefill, PrefillTokens: g.SumPrefill, PrefillKVTokens: g.SumPrefillKV,
		DecodeRequests: g.NumDecode, DecodeKVTokens: g.SumDecodeKV,
		VarPrefillLength: g.VarPrefill, VarDecodeKVTokens: g.VarDecodeKVTokens,
	}
}

func opt(v *uint64) dynamo.OptUint {
	if v == nil {
		return dynamo.OptUint{}
	}
	return dynamo.OptUint{Value: *v, Valid: true}
}

// normalize makes empty slices nil, for comparisons.
func normalize(d kvevents.DynamoEvent) kvevents.DynamoEvent {
	if len(d.Blocks) == 0 {
		d.Blocks = nil
	}
	if len(d.Removed) == 0 {
		d.Removed = nil
	}
	return d
}

// TestGoldenMockerParity checks, on a live mocker's capture, that the
// blocks its event plane published index like the same blocks from its
// vLLM-format port: kvroute hashes the vLLM event's tokens to Dynamo's
// tokens_hash, and the engine hashes agree.
func TestGoldenMockerParity(t *testing.T) {
	for _, pair := range [][2]string{
		{"dynamo161_mocker_kv_events_prompt", "dynamo161_mocker_vllm_prompt"},
		{"dynamo161_mocker_kv_events_output", "dynamo161_mocker_vllm_output"},
	} {
		var g *golden
		for _, x := range readGolden(t) {
			if x.name == pair[0] {
				g = &x
			}
		}
		require.NotNil(t, g, pair[0])
		var m dynamo.Message
		require.NoError(t, dynamo.DecodeZMQ(g.frames, &m))
		devs, err := dynamo.DecodeRouterEvents(nil, m.Envelope.Payload)
		require.NoError(t, err)
		require.Len(t, devs, 1)
		var fromDynamo kvroute.Event
		require.NoError(t, devs[0].ToEvent(&fromDynamo))

		payload, err := os.ReadFile(filepath.Join(capturedDir, pair[1]+".msgpack"))
		require.NoError(t, err)
		var b kvevents.Batch
		require.NoError(t, kvevents.DecodeBatch(payload, &b))
		conv, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: fromDynamo.Worker.ID, BlockSize: 16})
		require.NoError(t, err)
		evs, err := conv.Convert(nil, &b)
		require.NoError(t, err)
		require.Len(t, evs, 1)
		fromVLLM := evs[0]

		require.Equal(t, fromVLLM.Worker, fromDynamo.Worker)
		require.Equal(t, fromVLLM.HasParent, fromDynamo.HasParent)
		require.Equal(t, fromVLLM.Parent, fromDynamo.Parent)
		require.Len(t, fromDynamo.Blocks, len(fromVLLM.Blocks))
		for i := range fromVLLM.Blocks {
			require.Equal(t, fromVLLM.Blocks[i].External, fromDynamo.Blocks[i].External, "block %d", i)
			require.Equal(t, fromVLLM.Blocks[i].Hash, fromDynamo.Blocks[i].Hash, "block %d", i)
		}
	}
}
