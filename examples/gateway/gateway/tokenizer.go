package gateway

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/words"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/render"
)

// ErrTokenize is wrapped by tokenizer failures. The gateway answers them
// with 502 Bad Gateway: the request was fine, the tokenizer was not.
var ErrTokenize = errors.New("gateway: cannot tokenize")

// Prompt is what a request asks the engine to continue: the text or token
// ids of a /v1/completions request, or the messages of a
// /v1/chat/completions request.
type Prompt struct {
	// Model is the request's model name.
	Model string
	// Text is a completion prompt given as text.
	Text string
	// Tokens is a completion prompt given as token ids (then Text is
	// empty). Tokenizers return it as is.
	Tokens []uint32
	// Messages is a chat conversation (nil for completions).
	Messages []Message
	// Request is the request as the client sent it: messages with every
	// content part, tools, chat_template_kwargs. Tokenizers that render
	// chats as the engine does (RemoteTokenizer) send it whole; nil when
	// the prompt was not parsed from a request body.
	Request *openai.Request
}

// Message is one chat message. Content holds the message's text parts,
// joined by newlines; parts of other types (images, audio) are not part of
// it, so a tokenizer sees the text only.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// UnmarshalJSON reads an OpenAI chat message whose content is a string,
// null, or a list of parts ({"type": "text", "text": ...} and others,
// which are skipped).
func (m *Message) UnmarshalJSON(b []byte) error {
	var raw struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*m = Message{Role: raw.Role}
	if len(raw.Content) == 0 || bytes.Equal(raw.Content, []byte("null")) || json.Unmarshal(raw.Content, &m.Content) == nil {
		return nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw.Content, &parts); err != nil {
		return fmt.Errorf("content is neither text nor a list of parts: %w", err)
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	m.Content = strings.Join(texts, "\n")
	return nil
}

// Tokenizer turns a prompt into the token ids the engines will see. Routing
// is only as good as this agreement: the engines' KV events name blocks by
// their token ids, so a gateway tokenizer that disagrees with the engines'
// matches nothing.
//
// Tokenize appends the ids to dst and returns the extended slice. It is
// called concurrently from every request's goroutine.
type Tokenizer interface {
	Tokenize(ctx context.Context, p *Prompt, dst []uint32) ([]uint32, error)
}

// TokenizerFunc adapts a function to Tokenizer.
type TokenizerFunc func(ctx context.Context, p *Prompt, dst []uint32) ([]uint32, error)

// Tokenize calls f.
func (f TokenizerFunc) Tokenize(ctx context.Context, p *Prompt, dst []uint32) ([]uint32, error) {
	return f(ctx, p, dst)
}

// WordTokenizer is a deterministic tokenizer for tests and demonstrations:
// one token per run of non-space characters, whose id is the run's 32-bit
// FNV-1a hash. A chat conversation becomes, per message, the token of
// "<|role|>" followed by the content's tokens, and finally the token of
// "<|assistant|>" (the generation prompt). Its ids match no real model; use
// it only with engines that tokenize the same way. The zero value is ready
// to use and it never fails.
type WordTokenizer struct{}

// Tokenize implements Tokenizer.
func (WordTokenizer) Tokenize(_ context.Context, p *Prompt, dst []uint32) ([]uint32, error) {
	if p.Messages == nil {
		if p.Tokens != nil {
			return append(dst, p.Tokens...), nil
		}
		return words.Append(dst, p.Text), nil
	}
	for _, m := range p.Messages {
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
// as the client sent them (Prompt.Request: every content part, the tools,
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
func (t *RemoteTokenizer) Tokenize(ctx context.Context, p *Prompt, dst []uint32) ([]uint32, error) {
	if p.Messages == nil && p.Tokens != nil {
		return append(dst, p.Tokens...), nil
	}
	req := p.Request
	if req == nil {
		var err error
		if req, err = p.request(); err != nil {
			return dst, fmt.Errorf("%w: %w", ErrTokenize, err)
		}
	}
	api := render.APIVLLMTokenize
	if t.Render {
		api = render.APIVLLMRender
	}
	c := render.Client{URL: t.URL, API: api, HTTP: cmp.Or(t.Client, defaultTokenizeClient)}
	ids, err := c.Tokenize(ctx, req, dst)
	if err != nil {
		return dst, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	return ids, nil
}

// request builds the request a prompt made without one stands for: its
// model and text, or its messages as role and text.
func (p *Prompt) request() (*openai.Request, error) {
	fields := map[string]any{"model": p.Model}
	kind := openai.KindCompletion
	if p.Messages != nil {
		fields["messages"], kind = p.Messages, openai.KindChat
	} else {
		fields["prompt"] = p.Text
	}
	body, err := json.Marshal(fields)
	if err != nil {
		return nil, err
	}
	return openai.ParseRequest(body, kind)
}
