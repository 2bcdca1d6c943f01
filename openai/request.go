package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/kvroute/kvroute/internal/jsonread"
)

// ErrBadRequest is wrapped by errors about a request body that cannot be
// routed: malformed JSON, no prompt, a batch of several prompts, a field of
// the wrong type. A proxy answers them with 400 Bad Request.
var ErrBadRequest = errors.New("openai: bad request")

// Kind is the API a request body belongs to.
type Kind uint8

// The request kinds.
const (
	// KindCompletion is POST /v1/completions: a prompt given as text or
	// token ids.
	KindCompletion Kind = iota + 1
	// KindChat is POST /v1/chat/completions: messages rendered by the
	// engine's chat template.
	KindChat
)

// String returns the kind's API path.
func (k Kind) String() string {
	switch k {
	case KindCompletion:
		return "/v1/completions"
	case KindChat:
		return "/v1/chat/completions"
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// KindOfPath returns the kind of a request path (a query string is
// ignored), and false for paths that are neither completions nor chat
// completions.
func KindOfPath(path string) (Kind, bool) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch strings.TrimSuffix(path, "/") {
	case "/v1/completions", "/completions":
		return KindCompletion, true
	case "/v1/chat/completions", "/chat/completions":
		return KindChat, true
	}
	return 0, false
}

// Request is what kvroute reads of an OpenAI-compatible request body.
// The raw fields are the client's bytes, not copies: they alias the body
// given to ParseRequest.
type Request struct {
	Kind Kind
	// Model is the requested model name ("model").
	Model string
	// Prompt is a completion prompt given as text, and PromptTokens one
	// given as token ids (HasTokens is then set; Prompt is empty).
	Prompt       string
	PromptTokens []uint32
	HasTokens    bool
	// Messages is a chat request's "messages" array as received.
	Messages json.RawMessage
	// Tools is a chat request's "tools" array as received, nil when absent.
	Tools json.RawMessage
	// ChatTemplateKwargs is the vLLM/SGLang "chat_template_kwargs" object
	// as received, nil when absent.
	ChatTemplateKwargs json.RawMessage
	// CacheSalt is vLLM's "cache_salt": requests with different salts
	// never share cached blocks.
	CacheSalt string
	// Stream is set for a streamed response ("stream": true), and
	// IncludeUsage when the client asked for a final usage chunk
	// ("stream_options": {"include_usage": true}).
	Stream       bool
	IncludeUsage bool
	// MaxTokens is "max_tokens" or "max_completion_tokens", zero when
	// absent.
	MaxTokens int
	// Fields holds every top-level field as received (with the model set
	// by SetModel).
	Fields map[string]json.RawMessage

	modelSet bool // SetModel changed the model
}

// maxMessages bounds the messages of a chat request, so that a hostile
// body cannot make the parser build a huge slice.
const maxMessages = 1 << 16

// ParseRequest reads a request body of the given kind. Errors wrap
// ErrBadRequest.
func ParseRequest(body []byte, kind Kind) (*Request, error) {
	if kind != KindCompletion && kind != KindChat {
		return nil, fmt.Errorf("%w: unknown request kind %d", ErrBadRequest, kind)
	}
	r := &Request{Kind: kind}
	fields, err := decodeFields(body)
	if err != nil {
		return nil, fmt.Errorf("%w: body is not a JSON object: %w", ErrBadRequest, err)
	}
	if fields == nil {
		return nil, fmt.Errorf("%w: body is null", ErrBadRequest)
	}
	r.Fields = fields
	if err := field(r.Fields, "model", &r.Model); err != nil {
		return nil, err
	}
	if err := field(r.Fields, "stream", &r.Stream); err != nil {
		return nil, err
	}
	if err := field(r.Fields, "cache_salt", &r.CacheSalt); err != nil {
		return nil, err
	}
	if r.IncludeUsage, err = includeUsage(r.Fields["stream_options"]); err != nil {
		return nil, err
	}
	for _, name := range []string{"max_tokens", "max_completion_tokens"} {
		var n *int
		if err := field(r.Fields, name, &n); err != nil {
			return nil, err
		}
		if n != nil {
			r.MaxTokens = max(*n, 0)
		}
	}
	if kind == KindCompletion {
		return r, r.parsePrompt(r.Fields["prompt"])
	}
	return r, r.parseChat()
}

// decodeFields decodes a JSON object into its top-level fields, as
// encoding/json decodes it into a map[string]json.RawMessage, in one pass
// and with one copy of body, which the fields' values share; a JSON null
// gives a nil map.
func decodeFields(body []byte) (map[string]json.RawMessage, error) {
	own := bytes.Clone(body)
	d := jsonread.NewDecoder(own)
	switch d.PeekKind() {
	case 'n':
		if _, err := d.ReadToken(); err != nil {
			return nil, err
		}
		return nil, endOfJSON(d)
	case '{':
	default:
		if _, err := d.ReadValue(); err != nil {
			return nil, err
		}
		return nil, errors.New("not an object")
	}
	if _, err := d.ReadToken(); err != nil {
		return nil, err
	}
	fields := map[string]json.RawMessage{}
	for d.PeekKind() != '}' {
		k, err := d.ReadToken()
		if err != nil {
			return nil, err
		}
		name := k.String() // before the next read voids k
		v, err := d.ReadValue()
		if err != nil {
			return nil, err
		}
		end := int(d.InputOffset())
		fields[name] = json.RawMessage(own[end-len(v) : end : end])
	}
	if _, err := d.ReadToken(); err != nil {
		return nil, err
	}
	return fields, endOfJSON(d)
}

// endOfJSON checks that nothing but white space follows the value d read.
func endOfJSON(d *jsontext.Decoder) error {
	if _, err := d.ReadToken(); err != io.EOF {
		if err == nil {
			err = errors.New("data after the value")
		}
		return err
	}
	return nil
}

// field decodes the named field into v when it is present and not null.
func field(fields map[string]json.RawMessage, name string, v any) error {
	raw, ok := fields[name]
	if !ok || isNull(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%w: field %q: %w", ErrBadRequest, name, err)
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// includeUsage reads stream_options.include_usage. Engines (vLLM,
// SGLang, Dynamo) look the option up by its exact name, so it is matched
// exactly, not up to case as encoding/json matches a struct field; the
// last of duplicate names counts.
func includeUsage(raw json.RawMessage) (bool, error) {
	if len(raw) == 0 || isNull(raw) {
		return false, nil
	}
	if raw[0] != '{' {
		return false, fmt.Errorf("%w: field \"stream_options\": not a JSON object", ErrBadRequest)
	}
	opts, err := decodeFields(raw)
	if err != nil {
		return false, fmt.Errorf("%w: field \"stream_options\": %w", ErrBadRequest, err)
	}
	var on *bool
	if err := field(opts, "include_usage", &on); err != nil {
		return false, fmt.Errorf("stream_options: %w", err)
	}
	return on != nil && *on, nil
}

// parsePrompt reads a completion prompt: a string, token ids, or a batch
// of one of either.
func (r *Request) parsePrompt(raw json.RawMessage) error {
	if len(raw) == 0 || isNull(raw) {
		return fmt.Errorf("%w: no prompt", ErrBadRequest)
	}
	if json.Unmarshal(raw, &r.Prompt) == nil {
		return nil
	}
	var batch []json.RawMessage
	if err := json.Unmarshal(raw, &batch); err != nil {
		return fmt.Errorf("%w: prompt is neither text nor a list: %w", ErrBadRequest, err)
	}
	if len(batch) == 1 && !isNull(batch[0]) {
		if json.Unmarshal(batch[0], &r.Prompt) == nil {
			return nil
		}
		if ids, err := tokenIDs(batch[0]); err == nil {
			r.PromptTokens, r.HasTokens = ids, true
			return nil
		}
	}
	ids, err := tokenIDs(raw)
	if err != nil {
		return fmt.Errorf("%w: prompt must be one text or one list of token ids (batches are not routed): %w", ErrBadRequest, err)
	}
	r.PromptTokens, r.HasTokens = ids, true
	return nil
}

// tokenIDs decodes a non-empty JSON array of token ids. A null id is an
// error: encoding/json would leave a zero in its place, a token the client
// never sent.
func tokenIDs(raw json.RawMessage) ([]uint32, error) {
	var ids []*uint32
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, errors.New("no token ids")
	}
	out := make([]uint32, len(ids))
	for i, id := range ids {
		if id == nil {
			return nil, fmt.Errorf("token id %d is null", i)
		}
		out[i] = *id
	}
	return out, nil
}

// parseChat checks a chat request's messages (a non-empty array of objects
// with a role) and keeps them, the tools and chat_template_kwargs raw.
func (r *Request) parseChat() error {
	raw, ok := r.Fields["messages"]
	if !ok || isNull(raw) {
		return fmt.Errorf("%w: no messages", ErrBadRequest)
	}
	if err := checkRoles(raw); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	r.Messages = raw
	// The fields are valid JSON: their first byte tells their kind.
	if t, ok := r.Fields["tools"]; ok && !isNull(t) {
		if t[0] != '[' {
			return fmt.Errorf("%w: tools: not a JSON array", ErrBadRequest)
		}
		r.Tools = t
	}
	if k, ok := r.Fields["chat_template_kwargs"]; ok && !isNull(k) {
		if k[0] != '{' {
			return fmt.Errorf("%w: chat_template_kwargs: not a JSON object", ErrBadRequest)
		}
		r.ChatTemplateKwargs = k
	}
	return nil
}

// checkRoles checks that messages, valid JSON, is a non-empty array of at
// most maxMessages objects that each have a role, a string: as
// encoding/json matches a struct field, the last key equal to "role" up
// to case counts, and null counts as no role.
func checkRoles(messages json.RawMessage) error {
	d := jsonread.NewDecoder(messages)
	if d.PeekKind() != '[' {
		return errors.New("messages: not a JSON array")
	}
	if _, err := d.ReadToken(); err != nil {
		return fmt.Errorf("messages: %w", err)
	}
	n := 0
	for ; d.PeekKind() != ']'; n++ {
		if n == maxMessages {
			return fmt.Errorf("more than %d messages", maxMessages)
		}
		hasRole, err := messageHasRole(d)
		if err != nil {
			return fmt.Errorf("message %d: %w", n, err)
		}
		if !hasRole {
			return fmt.Errorf("message %d has no role", n)
		}
	}
	if n == 0 {
		return errors.New("no messages")
	}
	return nil
}

// messageHasRole reads the next message of d and reports whether it has a
// role.
func messageHasRole(d *jsontext.Decoder) (bool, error) {
	switch d.PeekKind() {
	case 'n':
		_, err := d.ReadToken()
		return false, err
	case '{':
	default:
		if _, err := d.ReadValue(); err != nil {
			return false, err
		}
		return false, errors.New("not a JSON object")
	}
	if _, err := d.ReadToken(); err != nil {
		return false, err
	}
	role := false
	for d.PeekKind() != '}' {
		k, err := d.ReadToken()
		if err != nil {
			return false, err
		}
		isRole := strings.EqualFold(k.String(), "role")
		kind := d.PeekKind()
		if _, err := d.ReadValue(); err != nil {
			return false, err
		}
		if isRole {
			switch kind {
			case 'n':
				role = false
			case '"':
				role = true
			default:
				return false, errors.New("role is not a string")
			}
		}
	}
	_, err := d.ReadToken()
	return role, err
}

// Message is one chat message as a plain tokenizer sees it: its role and
// the text of its content (a string, or the "text" parts of a list joined
// by newlines). Parts of other types (images, audio) and tool calls are
// not in it; a renderer that needs them reads Request.Messages.
type Message struct {
	Role    string
	Content string
}

// TextMessages returns a chat request's messages as role and text. It
// returns nil for a completion request.
func (r *Request) TextMessages() ([]Message, error) {
	if r.Kind != KindChat {
		return nil, nil
	}
	var raw []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(r.Messages, &raw); err != nil {
		return nil, fmt.Errorf("%w: messages: %w", ErrBadRequest, err)
	}
	out := make([]Message, len(raw))
	for i, m := range raw {
		out[i].Role = m.Role
		if len(m.Content) == 0 || isNull(m.Content) || json.Unmarshal(m.Content, &out[i].Content) == nil {
			continue
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(m.Content, &parts); err != nil {
			return nil, fmt.Errorf("%w: message %d: content is neither text nor a list of parts: %w", ErrBadRequest, i, err)
		}
		var texts []string
		for _, p := range parts {
			if p.Type == "text" {
				texts = append(texts, p.Text)
			}
		}
		out[i].Content = strings.Join(texts, "\n")
	}
	return out, nil
}

// SetModel replaces the request's model (and its "model" field), as when
// a model name maps to a LoRA adapter; Rewrite then includes it.
func (r *Request) SetModel(model string) error {
	if model == r.Model {
		return nil
	}
	raw, err := json.Marshal(model)
	if err != nil {
		return fmt.Errorf("%w: model: %w", ErrBadRequest, err)
	}
	fields := make(map[string]json.RawMessage, len(r.Fields)+1)
	for k, v := range r.Fields {
		fields[k] = v
	}
	fields["model"] = raw
	r.Fields, r.Model, r.modelSet = fields, model, true
	return nil
}

// Body returns the request's body as its fields now are (every field as
// received, but a model set with SetModel).
func (r *Request) Body() ([]byte, error) {
	b, err := json.Marshal(r.Fields)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return b, nil
}

// Rewrite returns the request's body with the model set by SetModel and,
// when includeUsage is set for a streamed request that did not ask for it,
// "stream_options": {"include_usage": true} added (other stream options
// are kept as received), and whether anything changed. Unchanged, it returns nil and
// false. Every other field is kept as received.
func (r *Request) Rewrite(includeUsage bool) ([]byte, bool, error) {
	fields, changed, err := r.rewriteFields(includeUsage)
	if err != nil || !changed {
		return nil, false, err
	}
	return encodeFields(fields), true, nil
}

// rewriteFields returns the fields Rewrite writes and whether they differ
// from the request's.
func (r *Request) rewriteFields(includeUsage bool) (map[string]json.RawMessage, bool, error) {
	fields := make(map[string]json.RawMessage, len(r.Fields)+2)
	for k, v := range r.Fields {
		fields[k] = v
	}
	changed := r.modelSet
	if includeUsage && r.Stream && !r.IncludeUsage {
		// ParseRequest checked that stream_options is an object or null.
		opts := map[string]json.RawMessage{}
		if raw, ok := r.Fields["stream_options"]; ok && !isNull(raw) {
			var err error
			if opts, err = decodeFields(raw); err != nil {
				return nil, false, fmt.Errorf("%w: stream_options: %w", ErrBadRequest, err)
			}
		}
		opts["include_usage"] = json.RawMessage("true")
		fields["stream_options"], changed = encodeFields(opts), true
	}
	return fields, changed, nil
}

// RewriteWithTokens returns Rewrite's body with the prompt's token ids
// added as "nvext": {"token_data": [...]}, the other fields of "nvext"
// kept. NVIDIA Dynamo's frontend, asked to serve a named worker (its
// direct routing mode), takes them as the prompt instead of tokenizing it
// again, so that the engine computes on exactly the tokens the router
// matched. It returns an error wrapping ErrBadRequest when "nvext" is
// neither an object nor null.
func (r *Request) RewriteWithTokens(includeUsage bool, ids []uint32) ([]byte, error) {
	fields, _, err := r.rewriteFields(includeUsage)
	if err != nil {
		return nil, err
	}
	nvext := map[string]json.RawMessage{}
	if raw, ok := r.Fields["nvext"]; ok && !isNull(raw) {
		if raw[0] != '{' {
			return nil, fmt.Errorf("%w: nvext: not a JSON object", ErrBadRequest)
		}
		if nvext, err = decodeFields(raw); err != nil {
			return nil, fmt.Errorf("%w: nvext: %w", ErrBadRequest, err)
		}
	}
	data := make([]byte, 0, 2+7*len(ids))
	data = append(data, '[')
	for i, id := range ids {
		if i > 0 {
			data = append(data, ',')
		}
		data = strconv.AppendUint(data, uint64(id), 10)
	}
	nvext["token_data"] = append(data, ']')
	fields["nvext"] = encodeFields(nvext)
	return encodeFields(fields), nil
}

// encodeFields writes fields, whose values are valid JSON, as a JSON
// object with its keys sorted, as encoding/json does, and the values as
// they are (encoding/json would compact them and escape HTML characters:
// the same JSON, written again).
func encodeFields(fields map[string]json.RawMessage) []byte {
	size := 2
	for k, v := range fields {
		size += len(k) + len(v) + 4
	}
	out := make([]byte, 0, size)
	out = append(out, '{')
	for i, k := range slices.Sorted(maps.Keys(fields)) {
		if i > 0 {
			out = append(out, ',')
		}
		out, _ = jsontext.AppendQuote(out, k) // keys are valid UTF-8: the decoder replaced what was not
		out = append(out, ':')
		out = append(out, fields[k]...)
	}
	return append(out, '}')
}
