package render

import (
	"context"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
)

// MMTokenizer is a Tokenizer that also reports the prompt's multimodal
// items (images and the placeholder tokens they occupy), which the
// engines hash into their blocks. *Client is one (the items come from
// vLLM's render endpoints).
type MMTokenizer interface {
	TokenizeMM(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, []kvroute.MMObject, error)
}

// TokenizeAll returns req's token ids from t and, when t is an
// MMTokenizer, the prompt's multimodal items.
func TokenizeAll(ctx context.Context, t Tokenizer, req *openai.Request) ([]uint32, []kvroute.MMObject, error) {
	if mt, ok := t.(MMTokenizer); ok {
		return mt.TokenizeMM(ctx, req, nil)
	}
	ids, err := t.Tokenize(ctx, req, nil)
	return ids, nil, err
}
