package gateway

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/openai"
)

// ErrBadRequest is wrapped by errors about a client request the gateway
// cannot route (malformed JSON, no prompt, a batch of prompts). The gateway
// answers them with 400 Bad Request.
var ErrBadRequest = errors.New("gateway: bad request")

// apiRequest is a client request being routed: the body as parsed once
// by openai.ParseRequest, and what the gateway changes in it.
type apiRequest struct {
	*openai.Request
	// injectedUsage is set when the gateway added stream_options
	// .include_usage to learn the cached tokens, so the usage chunk must
	// not reach the client.
	injectedUsage bool
	// tokens are the prompt's token ids when engines that take them
	// (engineHeaders.tokenData) may be sent them: nil for a multimodal
	// prompt. tokenBody is the body with them, made on first use.
	tokens    []uint32
	tokenBody []byte
}

// bodyFor returns the body to send to an engine with headers h: the
// forwarded body base, or, for an engine that takes the prompt's token
// ids, the body with them. A request whose "nvext" is not an object goes
// as it came, for the engine to answer.
func (r *apiRequest) bodyFor(h *engineHeaders, base []byte) []byte {
	if !h.tokenData || r.tokens == nil {
		return base
	}
	if r.tokenBody == nil {
		b, err := r.RewriteWithTokens(true, r.tokens)
		if err != nil {
			r.tokens = nil
			return base
		}
		r.tokenBody = b
	}
	return r.tokenBody
}

// parseRequest reads a request body of the given kind. Errors wrap
// ErrBadRequest (and openai.ErrBadRequest).
func parseRequest(body []byte, kind openai.Kind) (*apiRequest, error) {
	r, err := openai.ParseRequest(body, kind)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return &apiRequest{Request: r}, nil
}

// forwardBody returns the body to send to the engines: body itself, or
// the body rewritten with the model SetModel gave and, for a streaming
// request that did not ask for usage, stream_options.include_usage set
// (so that the last chunk reports the cached tokens).
func (r *apiRequest) forwardBody(body []byte) ([]byte, error) {
	out, changed, err := r.Rewrite(true)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	r.injectedUsage = r.Stream && !r.IncludeUsage
	if !changed {
		return body, nil
	}
	return out, nil
}

// apiError is the OpenAI error object.
type apiError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    int    `json:"code"`
}

// errorBody returns {"error": {...}} as JSON.
func errorBody(status int, typ, msg string) []byte {
	b, _ := json.Marshal(struct {
		Error apiError `json:"error"`
	}{apiError{Message: msg, Type: typ, Code: status}})
	return b
}
