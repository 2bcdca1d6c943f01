package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/openai"
)

// The gateway reads a body once, with openai.ParseRequest; its errors are
// the gateway's ErrBadRequest (400).
func TestParseRequest(t *testing.T) {
	tests := []struct {
		name       string
		kind       openai.Kind
		body       string
		wantText   string
		wantTokens []uint32
		wantMsgs   []openai.Message
		wantStream bool
		wantMax    int
		wantErr    string
	}{
		{name: "text", body: `{"model":"m","prompt":"a b","max_tokens":5}`, wantText: "a b", wantMax: 5},
		{name: "one text in a list", body: `{"prompt":["a b"]}`, wantText: "a b"},
		{name: "token ids", body: `{"prompt":[1,2,3],"stream":true}`, wantTokens: []uint32{1, 2, 3}, wantStream: true},
		{name: "one token list", body: `{"prompt":[[4,5]]}`, wantTokens: []uint32{4, 5}},
		{name: "batch of texts", body: `{"prompt":["a","b"]}`, wantErr: "batches are not routed"},
		{name: "no prompt", body: `{"model":"m"}`, wantErr: "no prompt"},
		{name: "bad stream", body: `{"prompt":"a","stream":"yes"}`, wantErr: `field "stream"`},
		{name: "not an object", body: `[1]`, wantErr: "not a JSON object"},
		{name: "chat", kind: openai.KindChat, body: `{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}},{"type":"text","text":"b"}]},{"role":"assistant","content":null}],"max_completion_tokens":9}`,
			wantMsgs: []openai.Message{{Role: "system", Content: "s"}, {Role: "user", Content: "a\nb"}, {Role: "assistant"}}, wantMax: 9},
		{name: "chat without messages", kind: openai.KindChat, body: `{"messages":[]}`, wantErr: "no messages"},
		{name: "chat without role", kind: openai.KindChat, body: `{"messages":[{"content":"x"}]}`, wantErr: "no role"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseRequest([]byte(tt.body), cmp.Or(tt.kind, openai.KindCompletion))
			if tt.wantErr != "" {
				require.ErrorIs(t, err, ErrBadRequest)
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantText, r.Prompt)
			require.Equal(t, tt.wantTokens, r.PromptTokens)
			msgs, err := r.TextMessages()
			require.NoError(t, err)
			require.Equal(t, tt.wantMsgs, msgs)
			require.Equal(t, tt.wantStream, r.Stream)
			require.Equal(t, tt.wantMax, r.MaxTokens)
		})
	}
}

func TestForwardBody(t *testing.T) {
	tests := []struct {
		name         string
		body         string
		wantOptions  string // stream_options sent to the engine, "" for the body unchanged
		wantInjected bool
	}{
		{name: "not streamed", body: `{"prompt":"a"}`},
		{name: "client asked for usage", body: `{"prompt":"a","stream":true,"stream_options":{"include_usage":true}}`},
		{name: "streamed", body: `{"prompt":"a","stream":true}`, wantOptions: `{"include_usage":true}`, wantInjected: true},
		{name: "other options kept", body: `{"prompt":"a","stream":true,"stream_options":{"continuous_usage_stats":false,"include_usage":false}}`,
			wantOptions: `{"continuous_usage_stats":false,"include_usage":true}`, wantInjected: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseRequest([]byte(tt.body), openai.KindCompletion)
			require.NoError(t, err)
			out, err := r.forwardBody([]byte(tt.body))
			require.NoError(t, err)
			require.Equal(t, tt.wantInjected, r.injectedUsage)
			if tt.wantOptions == "" {
				require.Equal(t, tt.body, string(out))
				return
			}
			var got map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(out, &got))
			require.JSONEq(t, tt.wantOptions, string(got["stream_options"]))
			require.JSONEq(t, `"a"`, string(got["prompt"]))
		})
	}
}

// hooks records what an sseBody reports.
type hooks struct {
	chunks, withChoices, errs int
	cached                    int
	known                     bool
	failures                  []error
	replace                   bool
}

func (h *hooks) chunk(ev *openai.Event) {
	h.chunks++
	if ev.HasChoices {
		h.withChoices++
	}
	if ev.Error {
		h.errs++
	}
	if ev.HasUsage && ev.Usage.CachedKnown {
		h.cached, h.known = ev.Usage.CachedTokens, true
	}
}

func (h *hooks) failed(err error) []byte {
	h.failures = append(h.failures, err)
	if h.replace {
		return errorEvent(502, "engine_error", "broken")
	}
	return nil
}

// brokenReader returns its data, then err.
type brokenReader struct {
	r   io.Reader
	err error
}

func (b *brokenReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		return n, b.err
	}
	return n, err
}

func (b *brokenReader) Close() error { return nil }

func TestSSEBody(t *testing.T) {
	const (
		chunk = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
		usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n"
		done  = "data: [DONE]\n\n"
	)
	long := "data: {\"choices\":[{\"text\":\"" + strings.Repeat("x", 40<<10) + "\"}]}\n\n"
	tests := []struct {
		name      string
		stream    string
		breakWith error // upstream error after the stream, nil for a clean end
		dropUsage bool
		replace   bool
		want      string // what the client reads
		wantErr   error
		wantCache int
		wantKnown bool
		choices   int
		// whole is set when the stream broke after its end marker: the
		// answer was whole, and the break no failure.
		whole bool
	}{
		{name: "relayed", stream: chunk + chunk + usage + done, want: chunk + chunk + usage + done, wantCache: 8, wantKnown: true, choices: 2},
		{name: "usage dropped", stream: chunk + usage + done, dropUsage: true, want: chunk + done, wantCache: 8, wantKnown: true, choices: 1},
		{name: "no usage", stream: chunk + done, dropUsage: true, want: chunk + done, choices: 1},
		{name: "CRLF and comments", stream: ": ping\r\n\r\ndata: {\"choices\":[1]}\r\n\r\n" + done,
			want: ": ping\r\n\r\ndata: {\"choices\":[1]}\r\n\r\n" + done, choices: 1},
		{name: "multi-line data", stream: "data: {\"choices\":\ndata: [1]}\n\n", want: "data: {\"choices\":\ndata: [1]}\n\n", choices: 1},
		{name: "longer than the buffer", stream: long + done, want: long + done, choices: 1},
		{name: "broken mid-stream", stream: chunk, breakWith: io.ErrUnexpectedEOF, replace: true,
			want: chunk + string(errorEvent(502, "engine_error", "broken")), choices: 1},
		{name: "broken, passed on", stream: chunk, breakWith: io.ErrUnexpectedEOF, want: chunk, wantErr: io.ErrUnexpectedEOF, choices: 1},
		{name: "truncated event", stream: "data: {\"cho", breakWith: io.EOF, want: "", wantErr: io.ErrUnexpectedEOF},
		{name: "broken after [DONE]", stream: chunk + usage + done, breakWith: context.Canceled, want: chunk + usage + done,
			wantCache: 8, wantKnown: true, choices: 1, whole: true},
		{name: "engine error event", stream: "data: {\"error\":{\"message\":\"x\"}}\n\n" + done, dropUsage: true,
			want: "data: {\"error\":{\"message\":\"x\"}}\n\n" + done},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &hooks{replace: tt.replace}
			brk := tt.breakWith
			if brk == nil {
				brk = io.EOF
			}
			b := newSSEBody(&brokenReader{r: strings.NewReader(tt.stream), err: brk}, h, tt.dropUsage)
			got, err := io.ReadAll(b)
			require.ErrorIs(t, err, tt.wantErr)
			require.Equal(t, tt.want, string(got))
			require.Equal(t, tt.wantCache, h.cached)
			require.Equal(t, tt.wantKnown, h.known)
			require.Equal(t, tt.choices, h.withChoices)
			if tt.whole {
				require.Empty(t, h.failures)
			} else if tt.breakWith != nil && tt.breakWith != io.EOF {
				require.Len(t, h.failures, 1)
				require.True(t, errors.Is(h.failures[0], tt.breakWith))
			}
		})
	}
}

func TestAdapterMapping(t *testing.T) {
	g := &Gateway{adapters: map[string]string{"support": "support-lora"}}
	tests := []struct {
		body, lora, model string
		stream            bool
	}{
		{`{"model":"support","prompt":"x"}`, "support-lora", "support-lora", false},
		{`{"model":"support","prompt":"x","stream":true}`, "support-lora", "support-lora", true},
		{`{"model":"support-lora","prompt":"x","cache_salt":"s"}`, "support-lora", "support-lora", false},
		{`{"model":"m","prompt":"x"}`, "", "m", false},
	}
	for _, tt := range tests {
		req, err := parseRequest([]byte(tt.body), openai.KindCompletion)
		require.NoError(t, err)
		lora, err := g.adapter(req)
		require.NoError(t, err)
		require.Equal(t, tt.lora, lora, tt.body)
		out, err := req.forwardBody([]byte(tt.body))
		require.NoError(t, err)
		var fields map[string]any
		require.NoError(t, json.Unmarshal(out, &fields))
		require.Equal(t, tt.model, fields["model"], tt.body)
		require.Equal(t, tt.model, req.Model, "the tokenizer sees the adapter")
		require.Equal(t, tt.stream, req.injectedUsage)
	}
}
