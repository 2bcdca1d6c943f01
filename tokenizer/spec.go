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
