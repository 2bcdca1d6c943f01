package openai

import (
	"encoding/json"
	"reflect"
	"testing"
)

// chunkSeeds are chunks and bodies on which JSON decoders' rules differ
// easily.
var chunkSeeds = []string{
	`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}],"usage":null}`,
	`{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}`,
	`{"Choices":[1],"USAGE":{"Prompt_Tokens":1},"usage":null}`,
	`{"usage":{"prompt_tokens":1.5}}`,
	`{"usage":{"prompt_tokens":99999999999999999999}}`,
	`{"usage":{"prompt_tokens_details":{"cached_tokens":null}}}`,
	`{"usage":{"prompt_tokens_details":null,"prompt_tokens":-2}}`,
	`{"choices":{},"usage":{"prompt_tokens":1}}`,
	`{"error":{"message":"x"}}`, `{"error":null}`, `{"error":"e"}`,
	`{"choices":null}`, `[]`, `null`, `"x"`, ``, `{`, `{"a":1} x`,
	"{\"choices\":[\"\xff\"],\"k\xff\":1}",
	` { "choices" : [ { } ] } `,
}

// FuzzDecodeChunkAgrees: decodeChunk and encoding/json accept the same
// chunks and read the same choices, usage and error from them.
func FuzzDecodeChunkAgrees(f *testing.F) {
	for _, s := range chunkSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkDecodeChunk)
}

func checkDecodeChunk(t *testing.T, data []byte) {
	t.Helper()
	var got, want chunkJSON
	err, wantErr := decodeChunk(data, &got), json.Unmarshal(data, &want)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("%q: decodeChunk error %v, encoding/json's %v", data, err, wantErr)
	}
	if err == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: decodeChunk read %+v, encoding/json %+v", data, got, want)
	}
}

// referenceBlankLine is blankLine testing every position.
func referenceBlankLine(b []byte, from int) int {
	for i := from; i+1 < len(b); i++ {
		if n := blankLineAt(b, i); n > 0 {
			return i + n
		}
	}
	return -1
}

// FuzzBlankLine: blankLine finds the terminator that testing every
// position finds, from every start.
func FuzzBlankLine(f *testing.F) {
	for _, s := range []string{"data: x\n\ndata: y\r\n\r\n", "a\rb\r\rc", "\n\r\n", "x\r\n", "\r", "\n", "", "data: {}\n", "a\r\n\rb\n\rc\r\r"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for from := 0; from <= len(b); from++ {
			if got, want := blankLine(b, from), referenceBlankLine(b, from); got != want {
				t.Fatalf("%q from %d: %d, testing every position %d", b, from, got, want)
			}
		}
	})
}
