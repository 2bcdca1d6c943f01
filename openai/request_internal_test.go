package openai

import (
	"encoding/json"
	"reflect"
	"testing"
)

// The encoding/json forms of the passes ParseRequest and Rewrite make over
// a body with jsontext: the oracles of FuzzRequestPassesAgree, whose seeds
// every test run checks.

// referenceDecodeFields decodes a body into its top-level fields.
func referenceDecodeFields(body []byte) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	err := json.Unmarshal(body, &fields)
	return fields, err
}

// referenceCheckRoles reads a chat's messages into structs with a role.
func referenceCheckRoles(messages json.RawMessage) error {
	var msgs []struct {
		Role *string `json:"role"`
	}
	if err := json.Unmarshal(messages, &msgs); err != nil {
		return err
	}
	if len(msgs) == 0 || len(msgs) > maxMessages {
		return ErrBadRequest
	}
	for _, m := range msgs {
		if m.Role == nil {
			return ErrBadRequest
		}
	}
	return nil
}

// requestSeeds are bodies on which JSON decoders' rules differ easily.
var requestSeeds = []string{
	`{"model":"m","prompt":"hello","stream":true,"max_tokens":8}`,
	`{"model":"m","model":"n","prompt":[1,2],"cache_salt":"s"}`,
	`{"messages":[{"role":"user","content":"hi"},{"ROLE":"assistant","content":null}],"tools":[{"type":"function"}],"chat_template_kwargs":{"a":1}}`,
	`{"messages":[{"role":"user","Role":null}]}`,
	`{"messages":[{"role":1}]}`,
	`{"messages":[null]}`,
	`{"messages":["x"]}`,
	`{"messages":[]}`,
	`{"messages":{}}`,
	"{\"messages\":[{\"role\":\"\xff\"}],\"k\xff\":\"\\ud800\"}",
	` { "prompt" : "spaced" , "stream" : false } `,
	`{"prompt":"x"} {}`, `{"prompt":"x"`, `null`, ` null `, `[]`, `"x"`, `1`, ``,
	`{"prompt":"<b>&</b>","stream":true,"stream_options":{"x":[1, 2]}}`,
	`{"\u006dodel":"m","prompt":"p"}`,
}

// FuzzRequestPassesAgree: decodeFields, checkRoles and encodeFields agree
// with their encoding/json forms: the same bodies accepted, the same
// fields read, the same messages refused, the same JSON written.
func FuzzRequestPassesAgree(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkRequestPasses)
}

func checkRequestPasses(t *testing.T, body []byte) {
	t.Helper()
	want, wantErr := referenceDecodeFields(body)
	got, err := decodeFields(body)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("%q: decodeFields error %v, encoding/json's %v", body, err, wantErr)
	}
	if err != nil {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: decodeFields read %q, encoding/json %q", body, got, want)
	}
	if msgs, ok := got["messages"]; ok && !isNull(msgs) {
		err, wantErr := checkRoles(msgs), referenceCheckRoles(msgs)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%q: checkRoles %v, encoding/json %v", msgs, err, wantErr)
		}
	}
	if got == nil {
		return
	}
	wantBody, err := json.Marshal(want)
	if err != nil {
		t.Fatalf("%q: encoding/json cannot write the fields back: %v", body, err)
	}
	var g, w any
	if err := json.Unmarshal(encodeFields(got), &g); err != nil {
		t.Fatalf("%q: encodeFields wrote invalid JSON %q: %v", body, encodeFields(got), err)
	}
	if err := json.Unmarshal(wantBody, &w); err != nil {
		t.Fatalf("%q: encoding/json wrote invalid JSON %q: %v", body, wantBody, err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("%q: encodeFields wrote %s, encoding/json %s", body, encodeFields(got), wantBody)
	}
}
