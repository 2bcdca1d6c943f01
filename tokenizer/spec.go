package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrUnsupported is wrapped by load errors about a tokenizer.json option
// this package does not implement. Such files are refused rather than
// approximated, since ids that differ from the engine's match nothing.
var ErrUnsupported = errors.New("tokenizer: unsupported option")

// ErrInvalid is wrapped by load errors about a malformed tokenizer.json.
var ErrInvalid = errors.New("tokenizer: invalid tokenizer.json")

// fileSpec is the top level of a Hugging Face tokenizer.json.
type fileSpec struct {
	Version       string          `json:"version"`
	Truncation    json.RawMessage `json:"truncation"`
	Padding       json.RawMessage `json:"padding"`
	AddedTokens   []addedSpec     `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Model         json.RawMessage `json:"model"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
}

type addedSpec struct {
	ID         *int64 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// isNull reports whether raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// componentType reads the "type" field of a component object.
func componentType(what string, raw json.RawMessage) (string, error) {
	var h struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrInvalid, what, err)
	}
	if h.Type == nil {
		return "", fmt.Errorf("%w: %s without a type", ErrInvalid, what)
	}
	return *h.Type, nil
}

// strict decodes raw into v, refusing fields v does not name: an option
// this package does not know might change the ids.
func strict(what string, raw json.RawMessage, v any) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		if bytes.Contains([]byte(err.Error()), []byte("unknown field")) {
			return fmt.Errorf("%w: %s: %w", ErrUnsupported, what, err)
		}
		return fmt.Errorf("%w: %s: %w", ErrInvalid, what, err)
	}
	return nil
}

// pattern is the "pattern" of Split pre-tokenizers and Replace
// normalizers and decoders: a literal string or a regular expression.
type pattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// sequence reads a Sequence component, {"type": "Sequence", key: [...]},
// parsing each item with parse.
func sequence[T any](what string, raw json.RawMessage, key string, parse func(json.RawMessage) (T, error)) ([]T, error) {
	var v map[string]json.RawMessage
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, what, err)
	}
	for k := range v {
		if k != "type" && k != key {
			return nil, fmt.Errorf("%w: %s: unknown field %q", ErrUnsupported, what, k)
		}
	}
	var items []json.RawMessage
	if err := json.Unmarshal(v[key], &items); err != nil {
		return nil, fmt.Errorf("%w: %s %s: %w", ErrInvalid, what, key, err)
	}
	out := make([]T, 0, len(items))
	for _, r := range items {
		x, err := parse(r)
		if err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return out, nil
}

// literalReplace reads a Replace normalizer or decoder, which this package
// supports with a literal pattern only.
func literalReplace(what string, raw json.RawMessage) (old, new string, err error) {
	var v struct {
		Type    string  `json:"type"`
		Pattern pattern `json:"pattern"`
		Content string  `json:"content"`
	}
	if err := strict(what, raw, &v); err != nil {
		return "", "", err
	}
	if v.Pattern.String == nil {
		return "", "", fmt.Errorf("%w: %s with a regular expression pattern", ErrUnsupported, what)
	}
	return *v.Pattern.String, v.Content, nil
}

// byteLevelSpec holds the options of the ByteLevel pre-tokenizer, decoder
// and post-processor (each reads what concerns it).
type byteLevelSpec struct {
	Type           string `json:"type"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	TrimOffsets    bool   `json:"trim_offsets"`
	UseRegex       *bool  `json:"use_regex"`
}
