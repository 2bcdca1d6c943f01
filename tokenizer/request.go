package tokenizer

import (
	"encoding/json"
	"fmt"

	"github.com/kvroute/kvroute/openai"
)

// EncodeRequest appends the prompt ids an OpenAI-compatible engine serving
// this model computes for a request, as vLLM does:
//
//   - /v1/completions: a text prompt is encoded with the post-processor's
//     special tokens unless the body sets "add_special_tokens": false; a
//     prompt given as ids is appended as is;
//   - /v1/chat/completions: the messages, tools and chat_template_kwargs
//     are rendered with the chat template ("add_generation_prompt"
//     defaults to true; "continue_final_message" is refused) and encoded
//     without special tokens unless the body sets "add_special_tokens":
//     true.
//
// Message contents given as lists of parts reach the template as lists,
// as in transformers. Errors wrap openai.ErrBadRequest for fields of the
// wrong type, or are RenderChat's.
func (m *Model) EncodeRequest(dst []uint32, req *openai.Request) ([]uint32, error) {
	flag := func(name string, def bool) (bool, error) {
		raw, ok := req.Fields[name]
		if !ok || isNull(raw) {
			return def, nil
		}
		var v bool
		if err := json.Unmarshal(raw, &v); err != nil {
			return false, fmt.Errorf("%w: field %q: %w", openai.ErrBadRequest, name, err)
		}
		return v, nil
	}
	switch req.Kind {
	case openai.KindCompletion:
		if req.HasTokens {
			return append(dst, req.PromptTokens...), nil
		}
		special, err := flag("add_special_tokens", true)
		if err != nil {
			return dst, err
		}
		return m.Tokenizer.Encode(dst, req.Prompt, special), nil
	case openai.KindChat:
		gen, err := flag("add_generation_prompt", true)
		if err != nil {
			return dst, err
		}
		cont, err := flag("continue_final_message", false)
		if err != nil {
			return dst, err
		}
		if cont {
			return dst, fmt.Errorf("%w: continue_final_message", ErrUnsupported)
		}
		special, err := flag("add_special_tokens", false)
		if err != nil {
			return dst, err
		}
		text, err := m.RenderChat(&Chat{Messages: req.Messages, Tools: req.Tools, AddGenerationPrompt: gen, Kwargs: req.ChatTemplateKwargs})
		if err != nil {
			return dst, err
		}
		return m.Tokenizer.Encode(dst, text, special), nil
	}
	return dst, fmt.Errorf("%w: request kind %v", openai.ErrBadRequest, req.Kind)
}
