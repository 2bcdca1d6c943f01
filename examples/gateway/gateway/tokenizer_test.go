package gateway_test

import (
	"cmp"
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/internal/fakeengine"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
)

func TestTokenizers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	engine := newFakeEngine(t, 1, blockSize, 64, 1, 0)
	broken := httptest.NewServer(http.NotFoundHandler())
	defer broken.Close()
	remote := &gateway.RemoteTokenizer{URL: engine.URL()}
	tests := []struct {
		name string
		kind openai.Kind
		body string
		want int // tokens
	}{
		{name: "text", body: `{"model":"m","prompt":" one two\tthree\n"}`, want: 3},
		{name: "empty", body: `{"model":"m","prompt":""}`, want: 0},
		{name: "unicode spaces", body: `{"model":"m","prompt":"a\u00a0b\u2003c"}`, want: 3},
		{name: "token ids", body: `{"model":"m","prompt":[5,6]}`, want: 2},
		{name: "chat", kind: openai.KindChat, body: `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi  there\n"}]}`,
			want: 1 + 2 + 1 + 2 + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := openai.ParseRequest([]byte(tt.body), cmp.Or(tt.kind, openai.KindCompletion))
			require.NoError(t, err)
			local, err := gateway.WordTokenizer{}.Tokenize(ctx, req, nil)
			require.NoError(t, err)
			require.Len(t, local, tt.want)
			again, err := gateway.WordTokenizer{}.Tokenize(ctx, req, []uint32{9})
			require.NoError(t, err)
			require.Equal(t, append([]uint32{9}, local...), again, "deterministic, appends")
			// The engine's /tokenize agrees with the local tokenizer.
			fromEngine, err := remote.Tokenize(ctx, req, nil)
			require.NoError(t, err)
			require.Equal(t, len(local), len(fromEngine))
			if len(local) > 0 {
				require.Equal(t, local, fromEngine)
			}
		})
	}
	text, err := openai.ParseRequest([]byte(`{"model":"m","prompt":"a"}`), openai.KindCompletion)
	require.NoError(t, err)
	_, err = (&gateway.RemoteTokenizer{URL: broken.URL}).Tokenize(ctx, text, nil)
	require.ErrorIs(t, err, gateway.ErrTokenize)
	require.ErrorContains(t, err, "404")
	engine.kill()
	_, err = remote.Tokenize(ctx, text, nil)
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
	textOnly, err := gateway.WordTokenizer{}.Tokenize(context.Background(), req, nil)
	require.NoError(t, err)
	require.NotEqual(t, want, textOnly, "the tools, the image and the kwargs change the ids")
	for _, rt := range []*gateway.RemoteTokenizer{{URL: e.URL()}, {URL: e.URL(), Render: true}} {
		got, err := rt.Tokenize(context.Background(), req, nil)
		require.NoError(t, err)
		require.Equal(t, want, got, "render %v", rt.Render)
	}
}

// TestGatewayPassesImagesToTheRouter sends chats whose prompts differ only
// in an image through a gateway that tokenizes with the engine's render
// endpoint: the router learns the images from it, so a different image
// is predicted to hit only the blocks before it, as the engine's cache
// (which hashes the image into its blocks) reports.
func TestGatewayPassesImagesToTheRouter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tok := &gateway.RemoteTokenizer{Render: true}
	c := newCluster(t, ctx, 1, router.Config{}, gateway.Config{Tokenizer: tok}, func(_ int, e *fakeEngine) { tok.URL = e.URL() })
	c.waitConnected(t, ctx)
	rng := rand.New(rand.NewPCG(7, 7))
	before, after := words(rng, 3*blockSize), words(rng, 2*blockSize)
	chat := func(image string) map[string]any {
		return map[string]any{"model": "m", "max_tokens": 2, "messages": []map[string]any{{"role": "user", "content": []map[string]any{
			{"type": "text", "text": before},
			{"type": "image_url", "image_url": map[string]any{"url": image}},
			{"type": "text", "text": after},
		}}}}
	}
	tests := []struct {
		name, image string
		hit         bool // the image's blocks are cached
	}{
		{name: "first", image: "https://img.example/a.png"},
		{name: "same image", image: "https://img.example/a.png", hit: true},
		{name: "other image", image: "https://img.example/b.png"},
	}
	predicted := map[string]int{}
	for i, tt := range tests {
		a, err := call(ctx, c.client, c.srv.URL, "/v1/chat/completions", chat(tt.image), i)
		require.NoError(t, err, tt.name)
		require.True(t, a.ok, "%s: %+v", tt.name, a)
		require.NotNil(t, a.usage, tt.name)
		cached := a.usage.PromptTokensDetails.CachedTokens
		require.Equal(t, cached, a.predicted, "%s: the router predicts what the engine finds cached", tt.name)
		predicted[tt.name] = a.predicted
		c.waitSynced(t, ctx)
	}
	require.Zero(t, predicted["first"])
	require.Greater(t, predicted["same image"], predicted["other image"], "the other image's blocks are not cached")
	// The blocks before the image are cached whichever image follows.
	require.Equal(t, 3*blockSize, predicted["other image"])
}
