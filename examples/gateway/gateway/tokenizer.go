package gateway

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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
		return appendWords(dst, p.Text), nil
	}
	for _, m := range p.Messages {
		dst = append(dst, roleToken(m.Role))
		dst = appendWords(dst, m.Content)
	}
	return append(dst, roleToken("assistant")), nil
}

// roleToken is the token of "<|role|>".
func roleToken(role string) uint32 {
	h := fnvAdd(fnvOffset, "<|")
	h = fnvAdd(h, role)
	return fnvAdd(h, "|>")
}

const (
	fnvOffset = 2166136261
	fnvPrime  = 16777619
)

func fnvAdd(h uint32, s string) uint32 {
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= fnvPrime
	}
	return h
}

// appendWords appends the FNV-1a hash of every run of non-space characters
// of s.
func appendWords(dst []uint32, s string) []uint32 {
	start := -1
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if unicode.IsSpace(r) {
			if start >= 0 {
				dst = append(dst, fnvAdd(fnvOffset, s[start:i]))
				start = -1
			}
		} else if start < 0 {
			start = i
		}
		i += n
	}
	if start >= 0 {
		dst = append(dst, fnvAdd(fnvOffset, s[start:]))
	}
	return dst
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

// tokenizeRequest is the body of vLLM's /tokenize.
type tokenizeRequest struct {
	Model               string    `json:"model,omitempty"`
	Prompt              *string   `json:"prompt,omitempty"`
	Messages            []Message `json:"messages,omitempty"`
	AddGenerationPrompt bool      `json:"add_generation_prompt,omitempty"`
}

// maxTokenizeResponse bounds the tokenizer's answer (a million token ids
// as decimal text).
const maxTokenizeResponse = 16 << 20

// Tokenize implements Tokenizer. Errors wrap ErrTokenize.
func (t *RemoteTokenizer) Tokenize(ctx context.Context, p *Prompt, dst []uint32) ([]uint32, error) {
	if p.Messages == nil && p.Tokens != nil {
		return append(dst, p.Tokens...), nil
	}
	if p.Request != nil {
		api := render.APIVLLMTokenize
		if t.Render {
			api = render.APIVLLMRender
		}
		c := render.Client{URL: t.URL, API: api, HTTP: cmp.Or(t.Client, defaultTokenizeClient)}
		ids, err := c.Tokenize(ctx, p.Request, dst)
		if err != nil {
			return dst, fmt.Errorf("%w: %w", ErrTokenize, err)
		}
		return ids, nil
	}
	req := tokenizeRequest{Model: p.Model}
	if p.Messages != nil {
		req.Messages, req.AddGenerationPrompt = p.Messages, true
	} else {
		req.Prompt = &p.Text
	}
	body, err := json.Marshal(&req)
	if err != nil {
		return dst, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(t.URL, "/")+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return dst, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	client := t.Client
	if client == nil {
		client = defaultTokenizeClient
	}
	resp, err := client.Do(hreq)
	if err != nil {
		return dst, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenizeResponse))
	if err != nil {
		return dst, fmt.Errorf("%w: reading the answer: %w", ErrTokenize, err)
	}
	if resp.StatusCode != http.StatusOK {
		return dst, fmt.Errorf("%w: %s answered %s: %.200s", ErrTokenize, hreq.URL, resp.Status, raw)
	}
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return dst, fmt.Errorf("%w: %s answered: %w", ErrTokenize, hreq.URL, err)
	}
	return append(dst, out.Tokens...), nil
}
