package render

import "testing"

// FuzzDecode: any answer decodes or fails with ErrTokenize, never panics,
// and multimodal items lie inside the ids.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"token_ids":[1,2,3,4],"features":{"mm_hashes":{"image":["abc"]},"mm_placeholders":{"image":[{"offset":1,"length":2}]}}}`))
	f.Add([]byte(`{"tokens":[1],"count":1}`))
	f.Add([]byte(`[{"token_ids":[9]}]`))
	f.Add([]byte(`{"token_ids":[1],"features":{"mm_placeholders":{"image":[{"offset":-1,"length":2}]}}}`))
	f.Add([]byte(`{"token_ids":[1,2,3],"features":{"mm_hashes":{"image":["abc"]},"mm_placeholders":{"image":[{"offset":1,"length":9223372036854775807}]}}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		ids, mm, err := decode(raw, nil)
		if err != nil {
			return
		}
		for _, o := range mm {
			if o.Offset < 0 || o.Length <= 0 || o.Offset > len(ids) || o.Length > len(ids)-o.Offset {
				t.Fatalf("item %+v outside %d ids", o, len(ids))
			}
		}
	})
}

// An item whose offset and length add up past the largest int lies
// outside the ids: it is refused, not wrapped around into range.
func TestDecodeRefusesOverflowingItem(t *testing.T) {
	raw := []byte(`{"token_ids":[1,2,3],"features":{"mm_hashes":{"image":["abc"]},"mm_placeholders":{"image":[{"offset":1,"length":9223372036854775807}]}}}`)
	if ids, mm, err := decode(raw, nil); err == nil {
		t.Fatalf("accepted item %+v outside %d ids", mm, len(ids))
	}
}
