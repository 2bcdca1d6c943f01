package dynamo_test

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/kvevents/dynamo"
)

// seedFrames adds every golden message to f, as its four frames.
func seedFrames(f *testing.F) []golden {
	gs := readGolden(f)
	for _, g := range gs {
		f.Add(g.frames[0], g.frames[1], g.frames[2], g.frames[3])
	}
	return gs
}

// FuzzDecodeZMQ: any four frames decode without panicking, and what
// decodes encodes back to a message that decodes the same.
func FuzzDecodeZMQ(f *testing.F) {
	seedFrames(f)
	f.Fuzz(func(t *testing.T, topic, pub, seq, data []byte) {
		var m dynamo.Message
		if dynamo.DecodeZMQ([][]byte{topic, pub, seq, data}, &m) != nil {
			return
		}
		e := m.Envelope
		var back dynamo.Message
		if err := dynamo.DecodeZMQ(dynamo.AppendZMQ(&e), &back); err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if e.Topic == "" { // the topic frame comes from the envelope
			back.Topic, back.Envelope.Topic = m.Topic, ""
		}
		if !reflect.DeepEqual(m, back) {
			t.Fatalf("round trip: %+v != %+v", m, back)
		}
	})
}

// FuzzDecodeEnvelope: a NATS body or data-frame envelope decodes without
// panicking and round-trips.
func FuzzDecodeEnvelope(f *testing.F) {
	for _, g := range readGolden(f) {
		body, err := dynamo.DecodeFrame(g.frames[3])
		require.NoError(f, err)
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var e dynamo.Envelope
		if dynamo.DecodeEnvelope(p, &e) != nil {
			return
		}
		var back dynamo.Envelope
		require.NoError(t, dynamo.DecodeEnvelope(dynamo.AppendEnvelope(nil, &e), &back))
		require.Equal(t, e, back)
	})
}

// payloads returns the golden payloads of a topic.
func payloads(f *testing.F, topic string) [][]byte {
	var out [][]byte
	for _, g := range readGolden(f) {
		var m dynamo.Message
		require.NoError(f, dynamo.DecodeZMQ(g.frames, &m))
		if m.Topic == topic {
			out = append(out, m.Envelope.Payload)
		}
	}
	return out
}

// FuzzDecodeRouterEvents: a kv-events payload decodes without panicking,
// and what decodes converts to valid events or an error.
func FuzzDecodeRouterEvents(f *testing.F) {
	for _, p := range payloads(f, dynamo.TopicKVEvents) {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		evs, err := dynamo.DecodeRouterEvents(nil, p)
		if err != nil {
			return
		}
		back, err := dynamo.AppendRouterEvents(nil, evs)
		require.NoError(t, err)
		again, err := dynamo.DecodeRouterEvents(nil, back)
		require.NoError(t, err)
		require.Len(t, again, len(evs))
		for i := range evs {
			require.Equal(t, normalize(evs[i]), normalize(again[i]))
		}
	})
}

// FuzzDecodeActiveLoad: a kv_metrics payload decodes without panicking and
// round-trips.
func FuzzDecodeActiveLoad(f *testing.F) {
	for _, p := range payloads(f, dynamo.TopicKVMetrics) {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var l dynamo.ActiveLoad
		if dynamo.DecodeActiveLoad(p, &l) != nil {
			return
		}
		var back dynamo.ActiveLoad
		require.NoError(t, dynamo.DecodeActiveLoad(dynamo.AppendActiveLoad(nil, &l), &back))
		require.Equal(t, l, back)
		_ = dynamo.LoadOf(&l, nil, 800, 16)
	})
}

// FuzzDecodeForwardPassMetrics: a forward-pass-metrics payload decodes
// without panicking, round-trips, and maps to a load without overflow.
func FuzzDecodeForwardPassMetrics(f *testing.F) {
	for _, p := range payloads(f, dynamo.TopicForwardPassMetrics) {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var m dynamo.ForwardPassMetrics
		if dynamo.DecodeForwardPassMetrics(p, &m) != nil {
			return
		}
		var back dynamo.ForwardPassMetrics
		require.NoError(t, dynamo.DecodeForwardPassMetrics(dynamo.AppendForwardPassMetrics(nil, &m), &back))
		require.Equal(t, m, back)
		l := dynamo.LoadOf(nil, &m, 800, 16)
		require.GreaterOrEqual(t, l.ActiveRequests, 0)
		require.GreaterOrEqual(t, l.QueueDepth, 0)
		require.GreaterOrEqual(t, l.ActivePrefillTokens, 0)
		require.GreaterOrEqual(t, l.ActiveDecodeBlocks, 0)
	})
}
