package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/kvroute/kvroute/chattemplate"
	"github.com/kvroute/kvroute/internal/jsonread"
)

// ErrNoTemplate is returned by chat methods when the model directory has
// no chat template (or none by the name asked for).
var ErrNoTemplate = errors.New("tokenizer: no chat template")

// specialTokenNames are the named special tokens transformers passes to
// chat templates (its SPECIAL_TOKENS_ATTRIBUTES).
var specialTokenNames = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

// Model is what a model directory says about tokenization: its
// tokenizer.json, its chat templates and its named special tokens, used
// together as transformers' AutoTokenizer and apply_chat_template do. It
// is immutable and safe for concurrent use.
type Model struct {
	// Tokenizer encodes text.
	Tokenizer *Tokenizer
	// SpecialTokens maps the named special tokens of tokenizer_config.json
	// ("bos_token", "eos_token", ...) to their text.
	SpecialTokens map[string]string

	templates map[string]*chattemplate.Template
	now       func() time.Time
}

// LoadOptions tune LoadModel. The zero value is ready to use.
type LoadOptions struct {
	// Now is the clock of the templates' strftime_now. Nil means time.Now.
	Now func() time.Time
}

// LoadModel loads a model directory: tokenizer.json, tokenizer_config.json
// (chat_template as a string or as a list of named templates, and the
// special tokens), special_tokens_map.json when present, and the template
// files chat_template.jinja and additional_chat_templates/*.jinja, which
// take priority over the config's templates as in transformers. Every
// template is parsed here, so that unsupported ones fail at load.
//
// The tokenizer is tokenizer.json as written. transformers 5 rebuilds the
// normalizer and pre-tokenizer of some tokenizer_class values from the
// class's own definition (LlamaTokenizer: no normalizer and Metaspace,
// whatever the file says); for a file that differs from its class, such
// as a Llama 2 file with the Prepend and Replace normalizers, an engine on
// transformers 5 encodes text after special tokens differently. Render
// probes (render.Probe) catch such a mismatch at startup.
func LoadModel(dir string, opts LoadOptions) (*Model, error) {
	tok, err := FromFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	m := &Model{Tokenizer: tok, SpecialTokens: map[string]string{}, templates: map[string]*chattemplate.Template{}, now: opts.Now}
	var cfg map[string]json.RawMessage
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("tokenizer: %w", err)
	default:
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, fmt.Errorf("%w: tokenizer_config.json: %w", ErrInvalid, err)
		}
	}
	readSpecials(cfg, m.SpecialTokens)
	if b, err := os.ReadFile(filepath.Join(dir, "special_tokens_map.json")); err == nil {
		var extra map[string]json.RawMessage
		if err := json.Unmarshal(b, &extra); err != nil {
			return nil, fmt.Errorf("%w: special_tokens_map.json: %w", ErrInvalid, err)
		}
		for k, v := range readSpecials(extra, map[string]string{}) {
			if _, ok := m.SpecialTokens[k]; !ok {
				m.SpecialTokens[k] = v
			}
		}
	}
	sources, err := templateSources(dir, cfg["chat_template"])
	if err != nil {
		return nil, err
	}
	for name, src := range sources {
		t, err := chattemplate.Parse(src)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: chat template %q: %w", name, err)
		}
		m.templates[name] = t
	}
	return m, nil
}

// readSpecials reads named special tokens given as strings or as
// AddedToken objects ({"content": ...}).
func readSpecials(cfg map[string]json.RawMessage, into map[string]string) map[string]string {
	for _, name := range specialTokenNames {
		raw, ok := cfg[name]
		if !ok || isNull(raw) {
			continue
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			into[name] = s
			continue
		}
		var obj struct {
			Content *string `json:"content"`
		}
		if json.Unmarshal(raw, &obj) == nil && obj.Content != nil {
			into[name] = *obj.Content
		}
	}
	return into
}

// templateSources returns the templates by name ("default" for the only
// or main one).
func templateSources(dir string, cfgTemplate json.RawMessage) (map[string]string, error) {
	out := map[string]string{}
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		out["default"] = string(b)
	}
	extra, _ := filepath.Glob(filepath.Join(dir, "additional_chat_templates", "*.jinja"))
	sort.Strings(extra)
	for _, p := range extra {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		out[strings.TrimSuffix(filepath.Base(p), ".jinja")] = string(b)
	}
	if len(out) > 0 || isNull(cfgTemplate) {
		return out, nil
	}
	var s string
	if json.Unmarshal(cfgTemplate, &s) == nil {
		out["default"] = s
		return out, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(cfgTemplate, &named); err != nil {
		return nil, fmt.Errorf("%w: tokenizer_config.json chat_template: %w", ErrInvalid, err)
	}
	for _, n := range named {
		out[n.Name] = n.Template
	}
	return out, nil
}

// Chat is a conversation to render, as given to transformers'
// apply_chat_template(messages, tools=..., add_generation_prompt=...,
// **kwargs). The JSON fields are kept as raw bytes so that object keys
// keep their order (tojson writes them in that order).
type Chat struct {
	// Messages is the JSON array of messages. Keys whose value is null
	// are dropped, as transformers does.
	Messages json.RawMessage
	// Tools is the JSON array of tool schemas, nil or null for none.
	Tools json.RawMessage
	// AddGenerationPrompt appends the header of the assistant's turn.
	AddGenerationPrompt bool
	// Kwargs is a JSON object of further template variables (such as
	// vLLM's chat_template_kwargs); they override the special tokens.
	Kwargs json.RawMessage
	// Template names the template to use; empty means "tool_use" when
	// tools are given and the model has one, else "default".
	Template string
}

// RenderChat renders a chat with the model's template. Errors wrap
// ErrNoTemplate, chattemplate's errors (a *chattemplate.RaisedError when
// the template rejects the conversation) or ErrInvalid for bad JSON.
func (m *Model) RenderChat(c *Chat) (string, error) {
	tools := !isNull(c.Tools)
	t, err := m.template(c.Template, tools)
	if err != nil {
		return "", err
	}
	vars := make(map[string]any, 8)
	for k, v := range m.SpecialTokens {
		vars[k] = v
	}
	if !isNull(c.Kwargs) {
		var kw map[string]json.RawMessage
		if err := json.Unmarshal(c.Kwargs, &kw); err != nil {
			return "", fmt.Errorf("%w: chat kwargs are not a JSON object: %w", ErrInvalid, err)
		}
		for k, v := range kw {
			vars[k] = v
		}
	}
	msgs, err := cleanMessages(c.Messages)
	if err != nil {
		return "", err
	}
	vars["messages"] = msgs
	vars["tools"] = nil
	if tools {
		vars["tools"] = c.Tools
	}
	vars["documents"] = nil
	vars["add_generation_prompt"] = c.AddGenerationPrompt
	return t.Render(vars, chattemplate.Options{Now: m.now})
}

// EncodeChat renders a chat and appends its ids to dst, encoded without
// the post-processor's special tokens (the template writes its own), as
// apply_chat_template(..., tokenize=True) does.
func (m *Model) EncodeChat(dst []uint32, c *Chat) ([]uint32, error) {
	text, err := m.RenderChat(c)
	if err != nil {
		return dst, err
	}
	return m.Tokenizer.Encode(dst, text, false), nil
}

func (m *Model) template(name string, tools bool) (*chattemplate.Template, error) {
	if name != "" {
		if t, ok := m.templates[name]; ok {
			return t, nil
		}
		return nil, fmt.Errorf("%w named %q", ErrNoTemplate, name)
	}
	if t, ok := m.templates["tool_use"]; ok && tools {
		return t, nil
	}
	if t, ok := m.templates["default"]; ok {
		return t, nil
	}
	if len(m.templates) > 0 {
		return nil, fmt.Errorf("%w: several templates and none named default", ErrNoTemplate)
	}
	return nil, ErrNoTemplate
}

// cleanMessages checks that messages is an array of objects, drops the
// keys whose value is null and copies the reasoning under the names
// templates read ("thinking", "reasoning_content"), as transformers does.
func cleanMessages(raw json.RawMessage) (json.RawMessage, error) {
	d := jsonread.NewDecoder(raw)
	if t, err := d.ReadToken(); err != nil || t.Kind() != '[' {
		return nil, fmt.Errorf("%w: messages are not a JSON array", ErrInvalid)
	}
	out := make([]byte, 0, len(raw)+64)
	out = append(out, '[')
	var fields []field
	n := 0
	for ; d.PeekKind() != ']'; n++ {
		var err error
		if fields, err = messageFields(d, raw, fields[:0]); err != nil {
			return nil, fmt.Errorf("%w: message %d: %w", ErrInvalid, n, err)
		}
		kept := cleanFields(fields)
		if n > 0 {
			out = append(out, ',')
		}
		out = append(out, '{')
		for j, f := range kept {
			if j > 0 {
				out = append(out, ',')
			}
			out, _ = jsontext.AppendQuote(out, f.k) // f.k is valid UTF-8: the decoder replaced what was not
			out = append(out, ':')
			out = append(out, f.v...)
		}
		out = append(out, '}')
	}
	if _, err := d.ReadToken(); err != nil {
		return nil, fmt.Errorf("%w: messages are not a JSON array: %w", ErrInvalid, err)
	}
	if _, err := d.ReadToken(); err != io.EOF {
		return nil, fmt.Errorf("%w: messages are not a JSON array: data after it", ErrInvalid)
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: no messages", ErrInvalid)
	}
	return append(out, ']'), nil
}

// cleanFields returns a message's fields without those whose value is
// null, and with its reasoning (the first of "reasoning_content",
// "thinking" and "reasoning" it has) under "thinking" and
// "reasoning_content" too.
func cleanFields(fields []field) []field {
	var kept []field
	var reasoning json.RawMessage
	for _, f := range fields {
		if !isNull(f.v) {
			kept = append(kept, f)
		}
	}
	for _, name := range []string{"reasoning_content", "thinking", "reasoning"} {
		for _, f := range kept {
			if f.k == name && reasoning == nil {
				reasoning = f.v
			}
		}
	}
	if reasoning != nil {
		kept = withField(withField(append([]field{{"thinking", reasoning}}, kept...), "thinking", reasoning), "reasoning_content", reasoning)
	}
	return kept
}

// messageFields reads the next value of d, which decodes raw, as a JSON
// object and appends its fields to dst in order, duplicates included. The
// fields' values are the bytes of raw they were read from.
func messageFields(d *jsontext.Decoder, raw []byte, dst []field) ([]field, error) {
	if d.PeekKind() != '{' {
		if _, err := d.ReadValue(); err != nil {
			return dst, err
		}
		return dst, errors.New("not a JSON object")
	}
	if _, err := d.ReadToken(); err != nil {
		return dst, err
	}
	for d.PeekKind() != '}' {
		k, err := d.ReadToken()
		if err != nil {
			return dst, err
		}
		name := k.String() // before the next read voids k
		v, err := d.ReadValue()
		if err != nil {
			return dst, err
		}
		end := int(d.InputOffset())
		dst = append(dst, field{name, raw[end-len(v) : end : end]})
	}
	_, err := d.ReadToken()
	return dst, err
}

type field struct {
	k string
	v json.RawMessage
}

// withField sets k to v at its first position, dropping later duplicates,
// or appends it.
func withField(fs []field, k string, v json.RawMessage) []field {
	out := fs[:0:0]
	seen := false
	for _, f := range fs {
		if f.k == k {
			if seen {
				continue
			}
			seen = true
			f.v = v
		}
		out = append(out, f)
	}
	if !seen {
		out = append(out, field{k, v})
	}
	return out
}
