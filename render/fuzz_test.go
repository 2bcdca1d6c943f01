package render

import "testing"

// FuzzDecode: any answer decodes or fails with ErrTokenize, never panics,
// and multimodal items lie inside the ids.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"token_ids":[1,2,3,4],"features":{"mm_hashes":{"image":["abc"]},"mm_placeholders":{"image":[{"offset":1,"length":2}]}}}`))
	f.Add([]byte(`{"tokens":[1],"count":1}`))
	f.Add([]byte(`[{"token_ids":[9]}]`))
	f.Add([]byte(`{"token_ids":[1],"features":{"mm_placeholders":{"image":[{"offset":-1,"length":2}]}}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		ids, mm, err := decode(raw, nil)
		if err != nil {
			return
		}
		for _, o := range mm {
			if o.Offset < 0 || o.Length <= 0 || o.Offset+o.Length > len(ids) {
				t.Fatalf("item %+v outside %d ids", o, len(ids))
			}
		}
	})
}
