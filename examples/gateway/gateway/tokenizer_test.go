package gateway_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/internal/fakeengine"
	"github.com/kvroute/kvroute/openai"
)

func TestTokenizers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	engine := newFakeEngine(t, 1, blockSize, 64, 1, 0)
	broken := httptest.NewServer(http.NotFoundHandler())
	defer broken.Close()
	remote := &gateway.RemoteTokenizer{URL: engine.URL()}
	chat := []gateway.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi  there\n"}}
	tests := []struct {
		name   string
		prompt gateway.Prompt
		want   int // tokens
	}{
		{name: "text", prompt: gateway.Prompt{Text: " one two\tthree\n"}, want: 3},
		{name: "empty", prompt: gateway.Prompt{Text: ""}, want: 0},
		{name: "unicode spaces", prompt: gateway.Prompt{Text: "a\u00a0b\u2003c"}, want: 3},
		{name: "token ids", prompt: gateway.Prompt{Tokens: []uint32{5, 6}}, want: 2},
		{name: "chat", prompt: gateway.Prompt{Messages: chat}, want: 1 + 2 + 1 + 2 + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			local, err := gateway.WordTokenizer{}.Tokenize(ctx, &tt.prompt, nil)
			require.NoError(t, err)
			require.Len(t, local, tt.want)
			again, err := gateway.WordTokenizer{}.Tokenize(ctx, &tt.prompt, []uint32{9})
			require.NoError(t, err)
			require.Equal(t, append([]uint32{9}, local...), again, "deterministic, appends")
			// The engine's /tokenize agrees with the local tokenizer.
			fromEngine, err := remote.Tokenize(ctx, &tt.prompt, nil)
			require.NoError(t, err)
			require.Equal(t, len(local), len(fromEngine))
			if len(local) > 0 {
				require.Equal(t, local, fromEngine)
			}
		})
	}
	_, err := (&gateway.RemoteTokenizer{URL: broken.URL}).Tokenize(ctx, &gateway.Prompt{Text: "a"}, nil)
	require.ErrorIs(t, err, gateway.ErrTokenize)
	require.ErrorContains(t, err, "404")
	engine.kill()
	_, err = remote.Tokenize(ctx, &gateway.Prompt{Text: "a"}, nil)
	require.ErrorIs(t, err, gateway.ErrTokenize)
}

func TestRemoteTokenizerSendsTheWholeChat(t *testing.T) {
	e, err := fakeengine.Start(fakeengine.Config{ID: 1})
	require.NoError(t, err)
	defer e.Close()
	body := `{"model":"m","tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}],` +
		`"chat_template_kwargs":{"enable_thinking":true},` +
		`"messages":[{"role":"user","content":[{"type":"text","text":"what is"},{"type":"image_url","image_url":{"url":"data:,x"}}]}]}`
	req, err := openai.ParseRequest([]byte(body), openai.KindChat)
	require.NoError(t, err)
	want, _, err := fakeengine.Render(req)
	require.NoError(t, err)
	textOnly, err := gateway.WordTokenizer{}.Tokenize(context.Background(), &gateway.Prompt{Messages: []gateway.Message{{Role: "user", Content: "what is"}}}, nil)
	require.NoError(t, err)
	require.NotEqual(t, want, textOnly, "the tools, the image and the kwargs change the ids")
	for _, rt := range []*gateway.RemoteTokenizer{{URL: e.URL()}, {URL: e.URL(), Render: true}} {
		got, err := rt.Tokenize(context.Background(), &gateway.Prompt{Model: "m", Request: req}, nil)
		require.NoError(t, err)
		require.Equal(t, want, got, "render %v", rt.Render)
	}
}
