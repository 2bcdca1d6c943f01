package render

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/openai"
)

// ErrMismatch is wrapped by *MismatchError.
var ErrMismatch = errors.New("render: token mismatch")

// MismatchError reports two tokenizations of the probe chat that differ:
// the router's ids would match nothing the engine caches after Index.
type MismatchError struct {
	// Index is the first position where the ids differ (the shorter
	// length when one is a prefix of the other).
	Index int
	// Router and Engine are the two lengths.
	Router, Engine int
}

// Error implements error.
func (e *MismatchError) Error() string {
	return fmt.Sprintf("render: the router's tokens differ from the engine's at %d (router %d tokens, engine %d): routing would find no cached prefix past it",
		e.Index, e.Router, e.Engine)
}

// Is reports ErrMismatch.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// Tokenizer is what Probe compares; epp.Tokenizer and *Client are ones.
type Tokenizer interface {
	Tokenize(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, error)
}

// ProbeBody returns the probe's chat completion body for model: a system
// prompt, a tool definition, a user turn with two text parts, an
// assistant tool call and its result, and chat_template_kwargs.
func ProbeBody(model string) []byte {
	name, _ := json.Marshal(model) // a string always marshals; invalid UTF-8 becomes U+FFFD
	return fmt.Appendf(nil, `{"model":%s,"messages":[`+
		`{"role":"system","content":"You are a careful assistant. Use the tools when they help."},`+
		`{"role":"user","content":[{"type":"text","text":"What is the weather in Paris"},{"type":"text","text":"in Celsius?"}]},`+
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"unit\":\"celsius\"}"}}]},`+
		`{"role":"tool","tool_call_id":"call_1","content":"18 degrees and sunny"}],`+
		`"tools":[{"type":"function","function":{"name":"get_weather","description":"Current weather for a city",`+
		`"parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["city"]}}}],`+
		`"chat_template_kwargs":{"enable_thinking":true},"max_tokens":1}`, name)
}

// Probe tokenizes the probe chat (ProbeBody) through the router's path and
// the engine's and returns a *MismatchError (matching ErrMismatch) when the
// ids differ, or the tokenizers' errors.
func Probe(ctx context.Context, router, engine Tokenizer, model string) error {
	req, err := openai.ParseRequest(ProbeBody(model), openai.KindChat)
	if err != nil {
		return err
	}
	a, err := router.Tokenize(ctx, req, nil)
	if err != nil {
		return fmt.Errorf("render: probe through the router's tokenizer: %w", err)
	}
	b, err := engine.Tokenize(ctx, req, nil)
	if err != nil {
		return fmt.Errorf("render: probe through the engine: %w", err)
	}
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return &MismatchError{Index: i, Router: len(a), Engine: len(b)}
		}
	}
	if len(a) != len(b) {
		return &MismatchError{Index: n, Router: len(a), Engine: len(b)}
	}
	return nil
}
