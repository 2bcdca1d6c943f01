// Package openai reads the OpenAI-compatible requests and responses that
// kvroute routes: the prompt of /v1/completions and /v1/chat/completions
// bodies, the usage (cached prompt tokens) of responses, and server-sent
// event streams.
//
// # Usage
//
// A host that sees a request body calls ParseRequest with the kind the
// request path names (KindOfPath), hands the Request to a tokenizer, and
// reads the engine's answer with ParseUsage (a JSON body) or an
// EventScanner (a stream):
//
//	kind, ok := openai.KindOfPath("/v1/chat/completions")
//	if !ok {
//		return errNotRouted
//	}
//	req, err := openai.ParseRequest(body, kind)
//	if err != nil {
//		return err // wraps openai.ErrBadRequest: answer 400
//	}
//	tokens, err := tokenizer.Tokenize(ctx, req, nil)
//
// Requests keep their messages, tools and chat_template_kwargs as the
// client sent them (json.RawMessage), so that a renderer can give the
// engine exactly what it would have seen.
//
// Nothing here does I/O; every function is safe for concurrent use, and
// none panics on its input (the parsers are fuzzed).
package openai
