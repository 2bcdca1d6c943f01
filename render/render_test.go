package render_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/fakeengine"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/render"
)

const agentChat = `{"model":"m","stream":true,
 "tools":[{"type":"function","function":{"name":"search","parameters":{"type":"object"}}}],
 "chat_template_kwargs":{"enable_thinking":true},
 "messages":[{"role":"system","content":"agent"},
  {"role":"user","content":[{"type":"text","text":"look at"},{"type":"image_url","image_url":{"url":"https://example.invalid/cat.png"}},{"type":"text","text":"please"}]}]}`

func TestClientForwardsEverything(t *testing.T) {
	e, err := fakeengine.Start(fakeengine.Config{ID: 1})
	require.NoError(t, err)
	defer e.Close()
	req, err := openai.ParseRequest([]byte(agentChat), openai.KindChat)
	require.NoError(t, err)
	want, wantMM, err := fakeengine.Render(req)
	require.NoError(t, err)
	textOnly, err := fakeengine.Words(context.Background(), req, nil)
	require.NoError(t, err)
	require.Greater(t, len(want), len(textOnly), "tools, image and kwargs add tokens")
	ctx := context.Background()
	for _, api := range []render.API{render.APIVLLMRender, render.APIVLLMTokenize, render.APISGLang} {
		c := &render.Client{URL: e.URL(), API: api}
		ids, mm, err := c.TokenizeMM(ctx, req, []uint32{7})
		require.NoError(t, err, api)
		require.Equal(t, append([]uint32{7}, want...), ids, "api %d", api)
		if api == render.APIVLLMRender {
			require.Len(t, mm, 1)
			h, _ := kvroute.MMIdentifierHash("https://example.invalid/cat.png")
			require.Equal(t, wantMM, mm)
			require.Equal(t, h, mm[0].Hash)
			require.Equal(t, fakeengine.ImageTokens, mm[0].Length)
		}
	}
	// Completions: text through the engine, ids as they are.
	for _, body := range []string{`{"model":"m","prompt":"a b c"}`, `{"prompt":[5,6,7]}`} {
		creq, err := openai.ParseRequest([]byte(body), openai.KindCompletion)
		require.NoError(t, err)
		ids, err := (&render.Client{URL: e.URL()}).Tokenize(ctx, creq, nil)
		require.NoError(t, err)
		require.Len(t, ids, 3)
	}
}

func TestClientErrors(t *testing.T) {
	answers := map[string]string{
		"/v1/chat/completions/render": `{"token_ids":[1,2,3],"features":{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":2,"length":5}]}}}`,
		"/v1/completions/render":      `{"nothing":1}`,
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a, ok := answers[r.URL.Path]; ok {
			_, _ = w.Write([]byte(a))
			return
		}
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	defer srv.Close()
	ctx := context.Background()
	chat, err := openai.ParseRequest([]byte(`{"messages":[{"role":"user","content":"x"}]}`), openai.KindChat)
	require.NoError(t, err)
	comp, err := openai.ParseRequest([]byte(`{"prompt":"x"}`), openai.KindCompletion)
	require.NoError(t, err)
	_, err = (&render.Client{URL: srv.URL}).Tokenize(ctx, chat, nil)
	require.ErrorIs(t, err, render.ErrTokenize)
	require.ErrorContains(t, err, "invalid image item")
	_, err = (&render.Client{URL: srv.URL}).Tokenize(ctx, comp, nil)
	require.ErrorContains(t, err, "no token ids")
	_, err = (&render.Client{URL: srv.URL, API: render.APISGLang}).Tokenize(ctx, comp, nil)
	require.ErrorContains(t, err, "500")
	_, err = (&render.Client{URL: "http://127.0.0.1:1"}).Tokenize(ctx, comp, nil)
	require.ErrorIs(t, err, render.ErrTokenize)
}

func TestProbeCatchesTemplateMismatch(t *testing.T) {
	good, err := fakeengine.Start(fakeengine.Config{ID: 1})
	require.NoError(t, err)
	defer good.Close()
	other, err := fakeengine.Start(fakeengine.Config{ID: 2})
	require.NoError(t, err)
	defer other.Close()
	textOnly, err := fakeengine.Start(fakeengine.Config{ID: 3, TextOnly: true})
	require.NoError(t, err)
	defer textOnly.Close()
	ctx := context.Background()
	gw := &render.Client{URL: good.URL()}
	require.NoError(t, render.Probe(ctx, gw, &render.Client{URL: other.URL(), API: render.APIVLLMTokenize}, "m"))
	err = render.Probe(ctx, gw, &render.Client{URL: textOnly.URL()}, "m")
	require.ErrorIs(t, err, render.ErrMismatch)
	var me *render.MismatchError
	require.ErrorAs(t, err, &me)
	require.Zero(t, me.Index, "the tools come first")
	require.Greater(t, me.Router, me.Engine)
}
