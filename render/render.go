// Package render tokenizes OpenAI-compatible requests exactly as the
// engines will: it sends the request's raw chat body (messages as
// received, tools, chat_template_kwargs, multimodal parts) to an engine's
// own render or tokenize endpoint and returns the token ids (and
// multimodal items) the engine will cache. A Probe checks at startup that
// two tokenization paths agree on a chat with tools.
//
// # Usage
//
//	tok := &render.Client{URL: "http://127.0.0.1:8000"} // an engine, or a render sidecar
//	if err := render.Probe(ctx, tok, &render.Client{URL: engineURL}, "my-model"); err != nil {
//		return err // errors.Is(err, render.ErrMismatch): the gateway would get zero hits
//	}
//	picker, _ := epp.New(epp.Config{Tokenizer: tok, ...})
//
// # Endpoints
//
// APIVLLMRender (the default) posts the request body as received to vLLM's
// POST /v1/chat/completions/render or /v1/completions/render, which apply
// the model's chat template with the request's tools and
// chat_template_kwargs and process its images, and answer {"token_ids":
// [...], "features": {"mm_hashes": ..., "mm_placeholders": ...}}; the
// render endpoints are served by `vllm serve` and by a GPU-less render
// server. APIVLLMTokenize posts to vLLM's POST /tokenize with the messages,
// tools, chat_template_kwargs and add_generation_prompt (no multimodal
// items are returned). APISGLang posts to SGLang's POST /v1/tokenize: a
// completion's prompt, or a chat's messages, tools and
// chat_template_kwargs.
//
// A completion given as token ids is returned as is, without a round trip.
package render

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
)

// ErrTokenize is wrapped by errors of the tokenizer round trip.
var ErrTokenize = errors.New("render: cannot tokenize")

// API is the endpoint family a Client talks to.
type API uint8

// The APIs.
const (
	APIVLLMRender API = iota
	APIVLLMTokenize
	APISGLang
)

// ParseAPI parses "vllm-render", "vllm-tokenize" or "sglang".
func ParseAPI(s string) (API, error) {
	switch s {
	case "", "vllm-render":
		return APIVLLMRender, nil
	case "vllm-tokenize":
		return APIVLLMTokenize, nil
	case "sglang":
		return APISGLang, nil
	}
	return 0, fmt.Errorf("render: unknown API %q (want vllm-render, vllm-tokenize or sglang)", s)
}

// Client tokenizes through an engine's (or a render server's) HTTP
// endpoints. It implements Tokenizer and MMTokenizer (and so
// epp.Tokenizer and epp.MMTokenizer). It is safe for concurrent use; URL
// is required.
type Client struct {
	// URL is the base URL, such as "http://127.0.0.1:8000".
	URL string
	// API selects the endpoints; the zero value is APIVLLMRender.
	API API
	// HTTP sends the requests. Nil means a client with a 10 s timeout.
	HTTP *http.Client
}

var defaultHTTP = &http.Client{Timeout: 10 * time.Second}

// maxResponse bounds an answer (a million token ids as decimal text).
const maxResponse = 16 << 20

// maxErrorBody bounds what is read, and quoted, of an error answer.
const maxErrorBody = 512

// Tokenize implements epp.Tokenizer: it appends the prompt's token ids
// to dst. Errors wrap ErrTokenize.
func (c *Client) Tokenize(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, error) {
	ids, _, err := c.TokenizeMM(ctx, req, dst)
	return ids, err
}

// TokenizeMM implements MMTokenizer: it appends the prompt's token ids
// to dst and returns its multimodal items in prompt order (APIVLLMRender
// only). Errors wrap ErrTokenize.
func (c *Client) TokenizeMM(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, []kvroute.MMObject, error) {
	if req.Kind == openai.KindCompletion && req.HasTokens {
		return append(dst, req.PromptTokens...), nil, nil
	}
	path, body, err := c.request(req)
	if err != nil {
		return dst, nil, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	raw, err := c.post(ctx, path, body)
	if err != nil {
		return dst, nil, err
	}
	return decode(raw, dst)
}

// request returns the path and body to post for req.
func (c *Client) request(req *openai.Request) (string, []byte, error) {
	chat := req.Kind == openai.KindChat
	switch c.API {
	case APIVLLMRender:
		body, err := req.Body()
		if chat {
			return "/v1/chat/completions/render", body, err
		}
		return "/v1/completions/render", body, err
	case APIVLLMTokenize, APISGLang:
		out := map[string]json.RawMessage{}
		keep := []string{"model", "prompt", "add_special_tokens"}
		if chat {
			keep = []string{"model", "messages", "tools", "chat_template", "chat_template_kwargs",
				"add_generation_prompt", "continue_final_message", "add_special_tokens", "mm_processor_kwargs"}
			out["add_generation_prompt"] = json.RawMessage("true")
		}
		for _, k := range keep {
			if v, ok := req.Fields[k]; ok {
				out[k] = v
			}
		}
		body, err := json.Marshal(out)
		if c.API == APISGLang {
			return "/v1/tokenize", body, err
		}
		return "/tokenize", body, err
	}
	return "", nil, fmt.Errorf("unknown API %d", c.API)
}

func (c *Client) post(ctx context.Context, path string, body []byte) ([]byte, error) {
	url := strings.TrimSuffix(c.URL, "/") + path
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	client := c.HTTP
	if client == nil {
		client = defaultHTTP
	}
	resp, err := client.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return nil, fmt.Errorf("%w: %s answered %s: %q", ErrTokenize, url, resp.Status, bytes.ToValidUTF8(msg, []byte("\uFFFD")))
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading %s: %w", ErrTokenize, url, err)
	}
	if len(raw) > maxResponse {
		return nil, fmt.Errorf("%w: %s answered with more than %d bytes (answer larger than any prompt's ids)", ErrTokenize, url, maxResponse)
	}
	return raw, nil
}

// answer is what the endpoints return: vLLM's render {"token_ids",
// "features"} (an object, or a list of one for completions) or the
// tokenizers' {"tokens"}.
type answer struct {
	TokenIDs []uint32 `json:"token_ids"`
	Tokens   []uint32 `json:"tokens"`
	Features *struct {
		Hashes       map[string][]string `json:"mm_hashes"`
		Placeholders map[string][]struct {
			Offset int `json:"offset"`
			Length int `json:"length"`
		} `json:"mm_placeholders"`
	} `json:"features"`
}

// decode reads an answer into dst and the multimodal items.
func decode(raw []byte, dst []uint32) ([]uint32, []kvroute.MMObject, error) {
	var a answer
	if err := json.Unmarshal(raw, &a); err != nil {
		var list []answer
		if json.Unmarshal(raw, &list) != nil || len(list) != 1 {
			return dst, nil, fmt.Errorf("%w: unreadable answer: %w", ErrTokenize, err)
		}
		a = list[0]
	}
	ids := a.TokenIDs
	if ids == nil {
		ids = a.Tokens
	}
	if ids == nil {
		return dst, nil, fmt.Errorf("%w: the answer has no token ids", ErrTokenize)
	}
	var mm []kvroute.MMObject
	if f := a.Features; f != nil {
		for modality, hashes := range f.Hashes {
			if _, ok := f.Placeholders[modality]; !ok && len(hashes) > 0 {
				return dst, nil, fmt.Errorf("%w: %d %s hashes without placeholders", ErrTokenize, len(hashes), modality)
			}
		}
		for modality, places := range f.Placeholders {
			hashes := f.Hashes[modality]
			if len(hashes) != len(places) {
				return dst, nil, fmt.Errorf("%w: %d %s hashes for %d placeholders", ErrTokenize, len(hashes), modality, len(places))
			}
			for i, p := range places {
				h, ok := kvroute.MMIdentifierHash(hashes[i])
				if !ok || p.Offset < 0 || p.Length <= 0 || p.Offset > len(ids) || p.Length > len(ids)-p.Offset {
					return dst, nil, fmt.Errorf("%w: invalid %s item %d", ErrTokenize, modality, i)
				}
				mm = append(mm, kvroute.MMObject{Hash: h, Offset: p.Offset, Length: p.Length})
			}
		}
		// In prompt order, whatever order the modalities came in.
		slices.SortStableFunc(mm, func(a, b kvroute.MMObject) int { return cmp.Compare(a.Offset, b.Offset) })
	}
	return append(dst, ids...), mm, nil
}
