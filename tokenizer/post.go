package tokenizer

import (
	"encoding/json"
	"fmt"
)

// postProcessor adds special tokens around an encoded sequence; encode
// appends the sequence itself.
type postProcessor interface {
	process(dst []uint32, encode func([]uint32) []uint32) []uint32
}

// template is TemplateProcessing's "single" template: special tokens and
// the sequence ($A) in order.
type template []templateItem

type templateItem struct {
	ids []uint32 // nil: the sequence
}

func (t template) process(dst []uint32, encode func([]uint32) []uint32) []uint32 {
	for _, it := range t {
		if it.ids == nil {
			dst = encode(dst)
		} else {
			dst = append(dst, it.ids...)
		}
	}
	return dst
}

type postSeq []postProcessor

func (q postSeq) process(dst []uint32, encode func([]uint32) []uint32) []uint32 {
	f := encode
	for _, p := range q {
		inner := f
		f = func(d []uint32) []uint32 { return p.process(d, inner) }
	}
	return f(dst)
}

// parsePostProcessor reads a "post_processor" object; nil means none (or
// one that adds no token, such as ByteLevel's).
func parsePostProcessor(raw json.RawMessage, vocab map[string]uint32) (postProcessor, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := componentType("post_processor", raw)
	if err != nil {
		return nil, err
	}
	what := "post_processor " + typ
	switch typ {
	case "ByteLevel":
		// It only adjusts offsets.
		var v struct {
			Type           string `json:"type"`
			AddPrefixSpace bool   `json:"add_prefix_space"`
			TrimOffsets    bool   `json:"trim_offsets"`
			UseRegex       *bool  `json:"use_regex"`
		}
		return nil, strict(what, raw, &v)
	case "TemplateProcessing":
		var v struct {
			Type   string `json:"type"`
			Single []struct {
				SpecialToken *struct {
					ID     string `json:"id"`
					TypeID int    `json:"type_id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID     string `json:"id"`
					TypeID int    `json:"type_id"`
				} `json:"Sequence"`
			} `json:"single"`
			Pair          json.RawMessage `json:"pair"`
			SpecialTokens map[string]struct {
				ID     string   `json:"id"`
				IDs    []int64  `json:"ids"`
				Tokens []string `json:"tokens"`
			} `json:"special_tokens"`
		}
		if err := strict(what, raw, &v); err != nil {
			return nil, err
		}
		var t template
		seq := 0
		for _, it := range v.Single {
			switch {
			case it.Sequence != nil:
				if it.Sequence.ID != "A" {
					return nil, fmt.Errorf("%w: %s single template with sequence %q", ErrInvalid, what, it.Sequence.ID)
				}
				seq++
				t = append(t, templateItem{})
			case it.SpecialToken != nil:
				st, ok := v.SpecialTokens[it.SpecialToken.ID]
				if !ok {
					return nil, fmt.Errorf("%w: %s names %q, which is not among its special tokens", ErrInvalid, what, it.SpecialToken.ID)
				}
				ids := make([]uint32, 0, len(st.IDs))
				for _, id := range st.IDs {
					if id < 0 || id > maxID {
						return nil, fmt.Errorf("%w: %s token id %d", ErrInvalid, what, id)
					}
					ids = append(ids, uint32(id))
				}
				t = append(t, templateItem{ids: ids})
			default:
				return nil, fmt.Errorf("%w: %s template item of unknown kind", ErrInvalid, what)
			}
		}
		if seq != 1 {
			return nil, fmt.Errorf("%w: %s single template has %d sequences", ErrInvalid, what, seq)
		}
		return t, nil
	case "Sequence":
		items, err := sequence(what, raw, "processors", func(r json.RawMessage) (postProcessor, error) {
			return parsePostProcessor(r, vocab)
		})
		if err != nil {
			return nil, err
		}
		var q postSeq
		for _, p := range items {
			if p != nil {
				q = append(q, p)
			}
		}
		switch len(q) {
		case 0:
			return nil, nil
		case 1:
			return q[0], nil
		}
		return q, nil
	}
	return nil, fmt.Errorf("%w: post_processor %q", ErrUnsupported, typ)
}
