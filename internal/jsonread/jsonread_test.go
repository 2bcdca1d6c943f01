package jsonread

import (
	"encoding/json"
	"testing"
)

// The decoder accepts what encoding/json accepts and rejects what it
// rejects, duplicate names and invalid UTF-8 included.
func TestNewDecoderAgreesWithEncodingJSON(t *testing.T) {
	for _, in := range []string{
		`{"a":1,"a":2}`,
		"{\"a\":\"\xff\"}",
		`[1,2,{"b":null}]`,
		`{"a":}`,
		`[1,]`,
		`"\ud800"`,
	} {
		_, err := NewDecoder([]byte(in)).ReadValue()
		want := json.Unmarshal([]byte(in), new(any))
		if (err == nil) != (want == nil) {
			t.Errorf("%q: jsonread error %v, encoding/json error %v", in, err, want)
		}
	}
}
