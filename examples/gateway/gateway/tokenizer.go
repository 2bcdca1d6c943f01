package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/chattemplate"
	"github.com/kvroute/kvroute/internal/words"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/render"
	"github.com/kvroute/kvroute/tokenizer"
)

// ErrTokenize is wrapped by tokenizer failures. The gateway answers them
// with 502 Bad Gateway: the request was fine, the tokenizer was not.
var ErrTokenize = errors.New("gateway: cannot tokenize")

// Tokenizer turns a request's prompt (its completion prompt, or its chat
// messages rendered by the model's chat template) into the token ids the
// engines will see. Routing is only as good as this agreement: the
// engines' KV events name blocks by their token ids, so a gateway
// tokenizer that disagrees with the engines' matches nothing. The request
// is the client's, as openai.ParseRequest read it; a tokenizer must not
// change it.
//
// Tokenize appends the ids to dst and returns the extended slice. It is
// called concurrently from every request's goroutine. Its errors make the
// gateway answer 502 (ErrTokenize) or, when they wrap
// openai.ErrBadRequest, 400.
type Tokenizer interface {
	Tokenize(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, error)
}

// MMTokenizer is an optional interface of a Tokenizer that also reports
// the prompt's multimodal items (images and the placeholder tokens they
// occupy), which the engines hash into their blocks: the gateway passes
// them to the router, so that a prompt whose image differs from the
// cached one's is not predicted to hit the blocks that hold the image.
// RemoteTokenizer has it (the items come from vLLM's render endpoints).
type MMTokenizer = render.MMTokenizer

// TokenizerFunc adapts a function to Tokenizer.
type TokenizerFunc func(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, error)

// Tokenize calls f.
func (f TokenizerFunc) Tokenize(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, error) {
	return f(ctx, req, dst)
}

// WordTokenizer is a deterministic tokenizer for tests and demonstrations:
// one token per run of non-space characters, whose id is the run's 32-bit
// FNV-1a hash. A chat conversation becomes, per message, the token of
// "<|role|>" followed by the content's tokens, and finally the token of
// "<|assistant|>" (the generation prompt). Its ids match no real model; use
// it only with engines that tokenize the same way. The zero value is ready
// to use and it never fails.
type WordTokenizer struct{}

// Tokenize implements Tokenizer. A chat's content parts other than text
// are skipped.
func (WordTokenizer) Tokenize(_ context.Context, req *openai.Request, dst []uint32) ([]uint32, error) {
	if req.Kind != openai.KindChat {
		if req.HasTokens {
			return append(dst, req.PromptTokens...), nil
		}
		return words.Append(dst, req.Prompt), nil
	}
	msgs, err := req.TextMessages()
	if err != nil {
		return dst, err
	}
	for _, m := range msgs {
		dst = append(dst, words.Role(m.Role))
		dst = words.Append(dst, m.Content)
	}
	return append(dst, words.Role("assistant")), nil
}

// RemoteTokenizer tokenizes through an engine's tokenizer endpoint: vLLM's
// POST /tokenize, which takes {"model", "prompt"} or {"model", "messages",
// "tools", "chat_template_kwargs", "add_generation_prompt"} and answers
// {"tokens": [...]}, or with Render vLLM's /v1/chat/completions/render and
// /v1/completions/render, which take the request body itself. Chats are sent
// as the client sent them (every content part, the tools,
// chat_template_kwargs), so the ids are exactly the engine's (chat template,
// tool definitions and special tokens included), at the price of one HTTP
// round trip per request.
//
// A RemoteTokenizer is safe for concurrent use; the zero value is not
// usable: URL is required.
type RemoteTokenizer struct {
	// URL is the engine's base URL, such as "http://10.0.0.7:8000".
	URL string
	// Client sends the requests. Nil means a client with a 10 s timeout.
	Client *http.Client
	// Render uses vLLM's render endpoints instead of /tokenize.
	Render bool
}

var defaultTokenizeClient = &http.Client{Timeout: 10 * time.Second}

// Tokenize implements Tokenizer. Errors wrap ErrTokenize.
func (t *RemoteTokenizer) Tokenize(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, error) {
	ids, _, err := t.TokenizeMM(ctx, req, dst)
	return ids, err
}

// TokenizeMM implements MMTokenizer: with Render, the multimodal items
// are those the engine's render endpoint reports; /tokenize reports none.
// Errors wrap ErrTokenize.
func (t *RemoteTokenizer) TokenizeMM(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, []kvroute.MMObject, error) {
	if req.Kind != openai.KindChat && req.HasTokens {
		return append(dst, req.PromptTokens...), nil, nil
	}
	api := render.APIVLLMTokenize
	if t.Render {
		api = render.APIVLLMRender
	}
	c := render.Client{URL: t.URL, API: api, HTTP: cmp.Or(t.Client, defaultTokenizeClient)}
	ids, mm, err := c.TokenizeMM(ctx, req, dst)
	if err != nil {
		return dst, nil, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	return ids, mm, nil
}

// ModelTokenizer tokenizes in process with a model directory's tokenizer
// and chat template (package tokenizer): the ids the engine serving that
// model computes, with no request to anyone. It is the tokenizer to use
// in front of an engine that has no tokenize endpoint, such as NVIDIA
// Dynamo's frontend. It is safe for concurrent use.
type ModelTokenizer struct {
	model *tokenizer.Model
}

// LoadModelTokenizer loads the tokenizer of the model directory dir
// (tokenizer.json and tokenizer_config.json, as a Hugging Face model
// holds them). Options the tokenizer package does not support are
// refused here, never approximated.
func LoadModelTokenizer(dir string) (*ModelTokenizer, error) {
	m, err := tokenizer.LoadModel(dir, tokenizer.LoadOptions{})
	if err != nil {
		return nil, err
	}
	return &ModelTokenizer{model: m}, nil
}

// Tokenize implements Tokenizer: a completion prompt is encoded with the
// model's special tokens, a chat rendered by its chat template. A request
// the template refuses (its raise_exception, such as roles that do not
// alternate) wraps ErrBadRequest; other errors wrap ErrTokenize.
func (t *ModelTokenizer) Tokenize(_ context.Context, req *openai.Request, dst []uint32) ([]uint32, error) {
	ids, err := t.model.EncodeRequest(dst, req)
	if err != nil {
		if _, ok := errors.AsType[*chattemplate.RaisedError](err); ok || errors.Is(err, openai.ErrBadRequest) {
			return dst, fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
		return dst, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	return ids, nil
}
