package gateway_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/examples/gateway/gateway"
)

func TestTokenizers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	engine := newFakeEngine(t, 1, blockSize, 64, 1, 0)
	broken := httptest.NewServer(http.NotFoundHandler())
	defer broken.Close()
	remote := &gateway.RemoteTokenizer{URL: engine.srv.URL}
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
