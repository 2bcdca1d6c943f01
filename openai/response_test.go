package openai_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/openai"
)

func TestParseUsage(t *testing.T) {
	u, ok := openai.ParseUsage([]byte(`{"usage":{"prompt_tokens":40,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":32}}}`))
	require.True(t, ok)
	require.Equal(t, openai.Usage{PromptTokens: 40, CompletionTokens: 3, CachedTokens: 32, CachedKnown: true}, u)
	u, ok = openai.ParseUsage([]byte(`{"usage":{"prompt_tokens":40}}`))
	require.True(t, ok)
	require.False(t, u.CachedKnown)
	_, ok = openai.ParseUsage([]byte(`{"choices":[]}`))
	require.False(t, ok)
	_, ok = openai.ParseUsage([]byte(`not json`))
	require.False(t, ok)
}

const stream = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n" +
	": keep-alive\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\r\n\r\n" +
	"data: {\"error\":{\"message\":\"x\"}}\n\n" +
	"data: [DONE]\n\n"

func scanAll(t testing.TB, s *openai.EventScanner, chunks [][]byte) (events []openai.Event, raw []byte) {
	for _, c := range chunks {
		s.Write(c, func(ev *openai.Event) {
			cp := *ev
			cp.Raw, cp.Data = bytes.Clone(ev.Raw), bytes.Clone(ev.Data)
			events = append(events, cp)
			raw = append(raw, ev.Raw...)
		})
	}
	return events, append(raw, s.Flush()...)
}

func TestEventScanner(t *testing.T) {
	for size := 1; size <= len(stream); size++ {
		var chunks [][]byte
		for b := []byte(stream); len(b) > 0; {
			n := min(size, len(b))
			chunks = append(chunks, b[:n])
			b = b[n:]
		}
		var s openai.EventScanner
		evs, raw := scanAll(t, &s, chunks)
		require.Equal(t, stream, string(raw), "chunk size %d", size)
		require.Len(t, evs, 5, "chunk size %d", size)
		require.True(t, evs[0].HasChoices)
		require.Empty(t, evs[1].Data)
		require.True(t, evs[2].UsageOnly)
		require.False(t, evs[2].HasChoices)
		require.Equal(t, 4, evs[2].Usage.CachedTokens)
		require.True(t, evs[3].Error)
		require.True(t, evs[4].Done)
	}
}

func TestEventScannerBounded(t *testing.T) {
	s := openai.EventScanner{MaxEventBytes: 16}
	long := "data: " + string(bytes.Repeat([]byte("x"), 40)) + "\n\ndata: [DONE]\n\n"
	evs, raw := scanAll(t, &s, [][]byte{[]byte(long[:30]), []byte(long[30:])})
	require.Equal(t, long, string(raw), "an oversized event passes through")
	require.True(t, evs[len(evs)-1].Done)
	for _, ev := range evs[:len(evs)-1] {
		require.Empty(t, ev.Data)
	}
}

// FuzzEventScanner: any stream split anywhere comes out byte for byte,
// with the same events as in one piece.
func FuzzEventScanner(f *testing.F) {
	f.Add([]byte(stream), uint8(7))
	f.Add([]byte("data: x\r\rdata: y\n\r\n"), uint8(1))
	f.Add([]byte("data: x\r\n\rdata: y\n\rdata: z\r\r\n"), uint8(11))
	f.Fuzz(func(t *testing.T, in []byte, cut uint8) {
		var whole openai.EventScanner
		want, raw := scanAll(t, &whole, [][]byte{in})
		require.Equal(t, string(in), string(raw))
		at := int(cut) % (len(in) + 1)
		var split openai.EventScanner
		got, raw := scanAll(t, &split, [][]byte{in[:at], in[at:]})
		require.Equal(t, string(in), string(raw))
		require.Equal(t, rawEvents(want), rawEvents(got))
	})
}

// rawEvents returns the events' raw bytes.
func rawEvents(evs []openai.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = string(ev.Raw)
	}
	return out
}

// Events end at a blank line in any mix of the line ends server-sent
// events allow (CRLF, LF, CR), whatever the chunks.
func TestEventScannerLineEnds(t *testing.T) {
	tests := []struct {
		in   string
		data []string // the events' data, then what Flush returns
		rest string
	}{
		{in: "data: a\n\ndata: b\n\n", data: []string{"a", "b"}},
		{in: "data: a\r\n\r\ndata: b\r\n\r\n", data: []string{"a", "b"}},
		{in: "data: a\r\rdata: b\r\rx", data: []string{"a", "b"}, rest: "x"},
		{in: "data: a\r\n\rdata: b\n\n", data: []string{"a", "b"}},
		{in: "data: a\n\rdata: b\n\n", data: []string{"a", "b"}},
		{in: "data: a\r\ndata: b\n\n", data: []string{"a\nb"}},
		{in: "data: a\n\r\ndata: b\n\n", data: []string{"a", "b"}},
		{in: "data: a\r\r\ndata: b\n\n", data: []string{"a", "b"}},
		// A CR at the end may be half a CRLF: the event waits for more.
		{in: "data: a\r\n\r", rest: "data: a\r\n\r"},
		{in: "data: a\r\r", rest: "data: a\r\r"},
	}
	for _, tc := range tests {
		for at := 0; at <= len(tc.in); at++ {
			var s openai.EventScanner
			var evs []openai.Event
			for _, chunk := range []string{tc.in[:at], tc.in[at:]} {
				s.Write([]byte(chunk), func(ev *openai.Event) { evs = append(evs, openai.Event{Data: bytes.Clone(ev.Data)}) })
			}
			var data []string
			for _, ev := range evs {
				data = append(data, string(ev.Data))
			}
			require.Equal(t, tc.data, data, "%q cut at %d", tc.in, at)
			require.Equal(t, tc.rest, string(s.Flush()), "%q cut at %d", tc.in, at)
		}
	}
}

// The blank line that ends an oversized event is found when it straddles
// two chunks.
func TestEventScannerBoundedStraddle(t *testing.T) {
	long := "data: xxxxxxxxxxxxxxxxxxxx"
	for _, cut := range [][2]string{
		{long + "\n", "\ndata: [DONE]\n\n"},
		{long + "\r\n\r", "\ndata: [DONE]\r\n\r\n"},
		{long + "\r", "\r\ndata: [DONE]\r\rx"},
		{long + "\r\n", "\r\ndata: [DONE]\r\n\r\n"},
	} {
		first, in := cut[0], cut[0]+cut[1]
		s := openai.EventScanner{MaxEventBytes: 16}
		evs, raw := scanAll(t, &s, [][]byte{[]byte(first), []byte(in[len(first):])})
		require.Equal(t, in, string(raw))
		require.NotEmpty(t, evs)
		require.True(t, evs[len(evs)-1].Done, "%q: the [DONE] event was lost", first)
	}
}

// FuzzParseUsage checks ParseUsage against a generic JSON decode of the
// same body: a usage is reported only for a valid JSON object whose "usage"
// is an object, counts are never negative, and CachedKnown says whether
// prompt_tokens_details.cached_tokens was present and not null.
func FuzzParseUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":40,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":32}}}`))
	f.Add([]byte(`{"choices":[{"text":"a"}],"usage":{"prompt_tokens":-1,"prompt_tokens_details":{"cached_tokens":null}}}`))
	f.Add([]byte(`{"usage":null}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":1e400}}`))
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		u, ok := openai.ParseUsage(body)
		if !ok {
			require.Equal(t, openai.Usage{}, u)
			return
		}
		require.True(t, json.Valid(body), "usage reported for invalid JSON")
		require.GreaterOrEqual(t, u.PromptTokens, 0)
		require.GreaterOrEqual(t, u.CompletionTokens, 0)
		require.GreaterOrEqual(t, u.CachedTokens, 0)
		var generic struct {
			Usage map[string]json.RawMessage `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(body, &generic))
		require.NotNil(t, generic.Usage, "usage reported for a body without a usage object")
		var details map[string]json.RawMessage
		if raw, has := generic.Usage["prompt_tokens_details"]; has {
			_ = json.Unmarshal(raw, &details)
		}
		if caseFolded(generic.Usage, "prompt_tokens_details") || caseFolded(details, "cached_tokens") {
			return // encoding/json matches keys case-insensitively; the model does not
		}
		raw, has := details["cached_tokens"]
		require.Equal(t, has && string(bytes.TrimSpace(raw)) != "null", u.CachedKnown)
		if !u.CachedKnown {
			require.Zero(t, u.CachedTokens)
		}
	})
}

// caseFolded reports whether m has a key that equals name only under case
// folding.
func caseFolded(m map[string]json.RawMessage, name string) bool {
	for k := range m {
		if k != name && strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

// BenchmarkEventScanner scans the stream of a 64-token streamed chat
// completion (a chunk per token, then the usage chunk and [DONE]) as the
// gateway relays it, reporting chunks/s.
func BenchmarkEventScanner(b *testing.B) {
	var stream []byte
	for i := range 64 {
		stream = fmt.Appendf(stream, "data: {\"id\":\"chatcmpl-7d3f\",\"object\":\"chat.completion.chunk\",\"created\":1732400000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word%d\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n", i)
	}
	stream = append(stream, "data: {\"id\":\"chatcmpl-7d3f\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":1600,\"completion_tokens\":64,\"prompt_tokens_details\":{\"cached_tokens\":1408}}}\n\ndata: [DONE]\n\n"...)
	events := 0
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		var s openai.EventScanner
		for off := 0; off < len(stream); off += 1024 { // as network reads deliver it
			s.Write(stream[off:min(off+1024, len(stream))], func(ev *openai.Event) {
				if ev.HasChoices || ev.HasUsage {
					events++
				}
			})
		}
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "chunks/s")
}
