package tokenizer

import (
	"encoding/json"
	"fmt"
)

// affix is what a post-processor adds around an encoded sequence: the
// TemplateProcessing "single" template's special tokens before and after
// $A, composed over a Sequence of processors.
type affix struct {
	before, after []uint32
}

// wrap composes an inner processor's affix inside this one.
func (a *affix) wrap(inner *affix) *affix {
	if inner == nil {
		return a
	}
	return &affix{
		before: append(append([]uint32(nil), a.before...), inner.before...),
		after:  append(append([]uint32(nil), inner.after...), a.after...),
	}
}

// parsePostProcessor reads a "post_processor" object; nil means none (or
// one that adds no token, such as ByteLevel's).
func parsePostProcessor(raw json.RawMessage) (*affix, error) {
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
		var v byteLevelSpec
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
		t := &affix{}
		seq := 0
		for _, it := range v.Single {
			switch {
			case it.Sequence != nil:
				if it.Sequence.ID != "A" {
					return nil, fmt.Errorf("%w: %s single template with sequence %q", ErrInvalid, what, it.Sequence.ID)
				}
				seq++
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
				if seq == 0 {
					t.before = append(t.before, ids...)
				} else {
					t.after = append(t.after, ids...)
				}
			default:
				return nil, fmt.Errorf("%w: %s template item of unknown kind", ErrInvalid, what)
			}
		}
		if seq != 1 {
			return nil, fmt.Errorf("%w: %s single template has %d sequences", ErrInvalid, what, seq)
		}
		return t, nil
	case "Sequence":
		items, err := sequence(what, raw, "processors", parsePostProcessor)
		if err != nil {
			return nil, err
		}
		// Each processor wraps what the previous ones produced.
		var out *affix
		for _, p := range items {
			if p != nil {
				out = p.wrap(out)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: post_processor %q", ErrUnsupported, typ)
}
