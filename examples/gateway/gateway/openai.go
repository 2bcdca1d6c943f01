package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/openai"
)

// ErrBadRequest is wrapped by errors about a client request the gateway
// cannot route (malformed JSON, no prompt, a batch of prompts). The gateway
// answers them with 400 Bad Request.
var ErrBadRequest = errors.New("gateway: bad request")

// apiRequest is what the gateway reads of an OpenAI-compatible request.
type apiRequest struct {
	fields map[string]json.RawMessage
	prompt Prompt
	stream bool
	// injectedUsage is set when the gateway added stream_options
	// .include_usage to learn the cached tokens, so the usage chunk must
	// not reach the client.
	injectedUsage bool
	maxTokens     int
	cacheSalt     string
	modelSet      bool // setModel changed the model: the body is re-encoded
}

// parseRequest reads a /v1/completions (chat false) or
// /v1/chat/completions (chat true) body. Errors wrap ErrBadRequest.
func parseRequest(body []byte, chat bool) (*apiRequest, error) {
	r := &apiRequest{}
	if err := json.Unmarshal(body, &r.fields); err != nil {
		return nil, fmt.Errorf("%w: body is not a JSON object: %w", ErrBadRequest, err)
	}
	if err := field(r.fields, "model", &r.prompt.Model); err != nil {
		return nil, err
	}
	if err := field(r.fields, "stream", &r.stream); err != nil {
		return nil, err
	}
	for _, name := range []string{"max_tokens", "max_completion_tokens"} {
		var n *int
		if err := field(r.fields, name, &n); err != nil {
			return nil, err
		}
		if n != nil {
			r.maxTokens = max(*n, 0)
		}
	}
	if err := field(r.fields, "cache_salt", &r.cacheSalt); err != nil {
		return nil, err
	}
	var err error
	kind := openai.KindCompletion
	if chat {
		kind = openai.KindChat
		r.prompt.Messages, err = parseMessages(r.fields["messages"])
	} else {
		err = parsePrompt(r.fields["prompt"], &r.prompt)
	}
	if err == nil {
		// The request as received (tools, chat_template_kwargs, content
		// parts), for tokenizers that render it as the engine does.
		r.prompt.Request, _ = openai.ParseRequest(body, kind)
	}
	return r, err
}

// setModel replaces the request's model, as a model name that maps to a
// LoRA adapter; forwardBody then sends the new name.
func (r *apiRequest) setModel(model string) error {
	raw, err := json.Marshal(model)
	if err != nil {
		return fmt.Errorf("%w: model: %w", ErrBadRequest, err)
	}
	r.fields["model"], r.prompt.Model, r.modelSet = raw, model, true
	if r.prompt.Request != nil {
		return r.prompt.Request.SetModel(model)
	}
	return nil
}

// field decodes the named field into v when it is present and not null.
func field(fields map[string]json.RawMessage, name string, v any) error {
	raw, ok := fields[name]
	if !ok || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%w: field %q: %w", ErrBadRequest, name, err)
	}
	return nil
}

// parsePrompt reads a completion prompt: a string, or token ids, or a
// batch of one of either.
func parsePrompt(raw json.RawMessage, p *Prompt) error {
	if len(raw) == 0 {
		return fmt.Errorf("%w: no prompt", ErrBadRequest)
	}
	if json.Unmarshal(raw, &p.Text) == nil {
		return nil
	}
	var batch []json.RawMessage
	if err := json.Unmarshal(raw, &batch); err != nil {
		return fmt.Errorf("%w: prompt is neither text nor a list: %w", ErrBadRequest, err)
	}
	if len(batch) == 1 {
		if json.Unmarshal(batch[0], &p.Text) == nil {
			return nil
		}
		if json.Unmarshal(batch[0], &p.Tokens) == nil && p.Tokens != nil {
			return nil
		}
	}
	if err := json.Unmarshal(raw, &p.Tokens); err != nil {
		return fmt.Errorf("%w: prompt must be one text or one list of token ids (batches are not routed): %w", ErrBadRequest, err)
	}
	return nil
}

// parseMessages reads chat messages.
func parseMessages(raw json.RawMessage) ([]Message, error) {
	var msgs []Message
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, fmt.Errorf("%w: messages: %w", ErrBadRequest, err)
	}
	if len(msgs) == 0 {
		return nil, fmt.Errorf("%w: no messages", ErrBadRequest)
	}
	return msgs, nil
}

// forwardBody returns the body to send to the engines: for a streaming
// request that did not ask for usage, the body with
// stream_options.include_usage set (so the last chunk reports the cached
// tokens), otherwise body itself.
func (r *apiRequest) forwardBody(body []byte) ([]byte, error) {
	if !r.stream {
		if r.modelSet {
			return r.encode()
		}
		return body, nil
	}
	opts := map[string]json.RawMessage{}
	if err := field(r.fields, "stream_options", &opts); err != nil {
		return nil, err
	}
	var include bool
	if raw, ok := opts["include_usage"]; ok && json.Unmarshal(raw, &include) == nil && include {
		if r.modelSet {
			return r.encode()
		}
		return body, nil
	}
	opts["include_usage"] = json.RawMessage("true")
	raw, err := json.Marshal(opts)
	if err != nil {
		return nil, fmt.Errorf("%w: stream_options: %w", ErrBadRequest, err)
	}
	r.fields["stream_options"] = raw
	r.injectedUsage = true
	return r.encode()
}

// encode returns the request's fields as a body.
func (r *apiRequest) encode() ([]byte, error) {
	out, err := json.Marshal(r.fields)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return out, nil
}

// apiUsage is the part of an OpenAI usage object the gateway reads.
type apiUsage struct {
	PromptTokens  int `json:"prompt_tokens"`
	PromptDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// cached returns the engine's cached prompt tokens, and whether it said.
func (u *apiUsage) cached() (int, bool) {
	if u == nil || u.PromptDetails == nil || u.PromptDetails.CachedTokens == nil {
		return 0, false
	}
	return max(*u.PromptDetails.CachedTokens, 0), true
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
