package openai_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/openai"
)

func TestKindOfPath(t *testing.T) {
	tests := []struct {
		path string
		want openai.Kind
		ok   bool
	}{
		{"/v1/completions", openai.KindCompletion, true},
		{"/v1/chat/completions?x=1", openai.KindChat, true},
		{"/v1/chat/completions/", openai.KindChat, true},
		{"/v1/embeddings", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		k, ok := openai.KindOfPath(tt.path)
		require.Equal(t, tt.ok, ok, tt.path)
		require.Equal(t, tt.want, k, tt.path)
	}
}

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name  string
		kind  openai.Kind
		body  string
		check func(t *testing.T, r *openai.Request)
		err   string
	}{
		{name: "text", kind: openai.KindCompletion, body: `{"model":"m","prompt":"hi","max_tokens":7,"cache_salt":"s1"}`,
			check: func(t *testing.T, r *openai.Request) {
				require.Equal(t, "m", r.Model)
				require.Equal(t, "hi", r.Prompt)
				require.Equal(t, 7, r.MaxTokens)
				require.Equal(t, "s1", r.CacheSalt)
				require.False(t, r.HasTokens)
			}},
		{name: "token ids", kind: openai.KindCompletion, body: `{"prompt":[1,2,3]}`,
			check: func(t *testing.T, r *openai.Request) {
				require.True(t, r.HasTokens)
				require.Equal(t, []uint32{1, 2, 3}, r.PromptTokens)
			}},
		{name: "batch of one text", kind: openai.KindCompletion, body: `{"prompt":["x y"]}`,
			check: func(t *testing.T, r *openai.Request) { require.Equal(t, "x y", r.Prompt) }},
		{name: "batch of one id list", kind: openai.KindCompletion, body: `{"prompt":[[4,5]]}`,
			check: func(t *testing.T, r *openai.Request) { require.Equal(t, []uint32{4, 5}, r.PromptTokens) }},
		{name: "batch", kind: openai.KindCompletion, body: `{"prompt":["a","b"]}`, err: "batches are not routed"},
		{name: "no prompt", kind: openai.KindCompletion, body: `{"model":"m"}`, err: "no prompt"},
		{name: "negative id", kind: openai.KindCompletion, body: `{"prompt":[-1]}`, err: "prompt"},
		{name: "not an object", kind: openai.KindCompletion, body: `[1]`, err: "not a JSON object"},
		{name: "null", kind: openai.KindChat, body: `null`, err: "null"},
		{name: "wrong stream type", kind: openai.KindCompletion, body: `{"prompt":"a","stream":"yes"}`, err: `field "stream"`},
		{name: "chat with tools", kind: openai.KindChat,
			body: `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:,"}},{"type":"text","text":"b"}]}],"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false}}`,
			check: func(t *testing.T, r *openai.Request) {
				require.True(t, r.Stream)
				require.True(t, r.IncludeUsage)
				require.JSONEq(t, `[{"type":"function","function":{"name":"f"}}]`, string(r.Tools))
				require.JSONEq(t, `{"enable_thinking":false}`, string(r.ChatTemplateKwargs))
				msgs, err := r.TextMessages()
				require.NoError(t, err)
				require.Equal(t, []openai.Message{{Role: "user", Content: "a\nb"}}, msgs)
			}},
		{name: "message without role", kind: openai.KindChat, body: `{"messages":[{"content":"x"}]}`, err: "no role"},
		{name: "empty messages", kind: openai.KindChat, body: `{"messages":[]}`, err: "no messages"},
		{name: "tools not a list", kind: openai.KindChat, body: `{"messages":[{"role":"user","content":"x"}],"tools":{}}`, err: "tools"},
		{name: "null token id", kind: openai.KindCompletion, body: `{"prompt":[1,null,3]}`, err: "null"},
		{name: "null token id in a batch of one", kind: openai.KindCompletion, body: `{"prompt":[[null]]}`, err: "prompt"},
		{name: "batch of one null", kind: openai.KindCompletion, body: `{"prompt":[null]}`, err: "prompt"},
		{name: "empty id list", kind: openai.KindCompletion, body: `{"prompt":[]}`, err: "no token ids"},
		{name: "empty id list in a batch of one", kind: openai.KindCompletion, body: `{"prompt":[[]]}`, err: "prompt"},
		{name: "include_usage by its exact name only", kind: openai.KindCompletion,
			body:  `{"prompt":"a","stream":true,"stream_options":{"Include_Usage":true,"include_uſage":true}}`,
			check: func(t *testing.T, r *openai.Request) { require.False(t, r.IncludeUsage) }},
		{name: "include_usage, the last of two", kind: openai.KindCompletion,
			body:  `{"prompt":"a","stream":true,"stream_options":{"include_usage":false,"include_usage":true}}`,
			check: func(t *testing.T, r *openai.Request) { require.True(t, r.IncludeUsage) }},
		{name: "include_usage not a boolean", kind: openai.KindCompletion,
			body: `{"prompt":"a","stream":true,"stream_options":{"include_usage":"yes"}}`, err: "include_usage"},
		{name: "stream_options not an object", kind: openai.KindCompletion,
			body: `{"prompt":"a","stream":true,"stream_options":[true]}`, err: "stream_options"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := openai.ParseRequest([]byte(tt.body), tt.kind)
			if tt.err != "" {
				require.ErrorIs(t, err, openai.ErrBadRequest)
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			tt.check(t, r)
		})
	}
}

// TestRewriteKeepsStreamOptions: the stream options Rewrite keeps beside
// the include_usage it adds are the bytes received, as every other field
// is: not compacted, not escaped again.
func TestRewriteKeepsStreamOptions(t *testing.T) {
	tests := []struct{ name, options, want string }{
		{name: "spaced array", options: `{"x":[1, 2]}`, want: `{"include_usage":true,"x":[1, 2]}`},
		{name: "html characters", options: `{"tag":"<b>&</b>"}`, want: `{"include_usage":true,"tag":"<b>&</b>"}`},
		{name: "include_usage false replaced", options: `{"include_usage":false,"a":{ "b" : 1 }}`, want: `{"a":{ "b" : 1 },"include_usage":true}`},
		{name: "null", options: `null`, want: `{"include_usage":true}`},
		{name: "empty", options: `{}`, want: `{"include_usage":true}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := openai.ParseRequest([]byte(`{"prompt":"a","stream":true,"stream_options":`+tt.options+`}`), openai.KindCompletion)
			require.NoError(t, err)
			body, changed, err := r.Rewrite(true)
			require.NoError(t, err)
			require.True(t, changed)
			require.Equal(t, `{"prompt":"a","stream":true,"stream_options":`+tt.want+`}`, string(body))
		})
	}
}

func TestRewrite(t *testing.T) {
	r, err := openai.ParseRequest([]byte(`{"model":"m","prompt":"a","stream":true,"stream_options":{"continuous_usage_stats":false}}`), openai.KindCompletion)
	require.NoError(t, err)
	require.NoError(t, r.SetModel("adapter-a"))
	body, changed, err := r.Rewrite(true)
	require.NoError(t, err)
	require.True(t, changed)
	var got map[string]any
	require.NoError(t, json.Unmarshal(body, &got))
	require.Equal(t, map[string]any{"include_usage": true, "continuous_usage_stats": false}, got["stream_options"])
	require.Equal(t, "adapter-a", got["model"])
	require.Equal(t, "a", got["prompt"])
	again, err := openai.ParseRequest(body, openai.KindCompletion)
	require.NoError(t, err)
	require.NoError(t, again.SetModel("adapter-a"))
	_, changed, err = again.Rewrite(true)
	require.NoError(t, err)
	require.False(t, changed, "already asks for usage, same model")
	_, changed, err = again.Rewrite(false)
	require.NoError(t, err)
	require.False(t, changed)
}

func TestRewriteWithTokens(t *testing.T) {
	tests := []struct {
		name, body string
		want       map[string]any // the fields checked in the rewritten body
		err        string
	}{
		{name: "no nvext", body: `{"model":"m","messages":[{"role":"user","content":"a"}]}`,
			want: map[string]any{"nvext": map[string]any{"token_data": []any{1.0, 2.0, 300000.0}}, "model": "m"}},
		{name: "nvext kept", body: `{"messages":[{"role":"user","content":"a"}],"nvext":{"annotations":["x"],"token_data":[9]}}`,
			want: map[string]any{"nvext": map[string]any{"annotations": []any{"x"}, "token_data": []any{1.0, 2.0, 300000.0}}}},
		{name: "nvext null", body: `{"messages":[{"role":"user","content":"a"}],"nvext":null}`,
			want: map[string]any{"nvext": map[string]any{"token_data": []any{1.0, 2.0, 300000.0}}}},
		{name: "stream usage added too", body: `{"messages":[{"role":"user","content":"a"}],"stream":true}`,
			want: map[string]any{"stream_options": map[string]any{"include_usage": true}, "nvext": map[string]any{"token_data": []any{1.0, 2.0, 300000.0}}}},
		{name: "nvext not an object", body: `{"messages":[{"role":"user","content":"a"}],"nvext":[1]}`, err: "nvext"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := openai.ParseRequest([]byte(tt.body), openai.KindChat)
			require.NoError(t, err)
			body, err := r.RewriteWithTokens(true, []uint32{1, 2, 300000})
			if tt.err != "" {
				require.ErrorIs(t, err, openai.ErrBadRequest)
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			var got map[string]any
			require.NoError(t, json.Unmarshal(body, &got))
			for k, v := range tt.want {
				require.Equal(t, v, got[k], k)
			}
			require.Equal(t, []any{map[string]any{"role": "user", "content": "a"}}, got["messages"], "the other fields as received")
			again, err := openai.ParseRequest(body, openai.KindChat)
			require.NoError(t, err, "the rewritten body parses")
			require.Equal(t, r.Messages, again.Messages)
		})
	}
}

// FuzzParseRequest: any body gives a request or an error wrapping
// ErrBadRequest, never a panic; a parsed chat's text messages and a
// streamed request's usage body parse again.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello world","stream":true}`,
		`{"prompt":[[1,2,3]]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"tools":[],"chat_template_kwargs":{"x":1},"cache_salt":"s"}`,
		`{"messages":[{"role":"user","content":null}],"max_completion_tokens":-4}`,
		`{"prompt":"x","stream":true,"stream_options":null}`,
		`{}`, `[]`, `null`, `{"messages":[{}]}`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Add([]byte(`{"prompt":"x","stream":true,"stream_options":{"include_uſage":false}}`), false)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		kind := openai.KindCompletion
		if chat {
			kind = openai.KindChat
		}
		r, err := openai.ParseRequest(body, kind)
		if err != nil {
			require.ErrorIs(t, err, openai.ErrBadRequest)
			return
		}
		require.GreaterOrEqual(t, r.MaxTokens, 0)
		if chat {
			require.NotEmpty(t, r.Messages)
			_, _ = r.TextMessages()
		}
		require.NoError(t, r.SetModel("x"))
		if b, changed, err := r.Rewrite(true); err == nil && changed {
			again, err := openai.ParseRequest(b, kind)
			require.NoError(t, err)
			require.Equal(t, r.Stream, again.IncludeUsage)
			require.Equal(t, "x", again.Model)
		}
	})
}
