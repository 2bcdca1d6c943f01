package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

// referenceCleanMessages is cleanMessages written with encoding/json, the
// oracle of FuzzCleanMessages (whose seeds every test run checks): an
// array of objects, each read field by field in order, duplicates
// included, then cleaned by the same cleanFields.
func referenceCleanMessages(raw json.RawMessage) ([]byte, error) {
	var msgs []json.RawMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		return nil, errors.New("no messages")
	}
	var out bytes.Buffer
	out.WriteByte('[')
	for i, m := range msgs {
		d := json.NewDecoder(bytes.NewReader(m))
		if t, err := d.Token(); err != nil || t != json.Delim('{') {
			return nil, fmt.Errorf("message %d: not a JSON object", i)
		}
		var fields []field
		for d.More() {
			k, err := d.Token()
			if err != nil {
				return nil, err
			}
			var v json.RawMessage
			if err := d.Decode(&v); err != nil {
				return nil, err
			}
			fields = append(fields, field{k.(string), v})
		}
		kept := cleanFields(fields)
		if i > 0 {
			out.WriteByte(',')
		}
		out.WriteByte('{')
		for j, f := range kept {
			if j > 0 {
				out.WriteByte(',')
			}
			k, _ := json.Marshal(f.k)
			out.Write(k)
			out.WriteByte(':')
			out.Write(f.v)
		}
		out.WriteByte('}')
	}
	out.WriteByte(']')
	return out.Bytes(), nil
}

// canonicalJSON writes valid JSON as the sequence of its tokens, object
// keys in order and duplicates kept, so that two texts that differ only
// in white space or in how strings are escaped compare equal.
func canonicalJSON(raw []byte) (string, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var sb strings.Builder
	for {
		t, err := d.Token()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return sb.String(), nil
			}
			return "", err
		}
		fmt.Fprintf(&sb, "%T:%v ", t, t)
	}
}

// cleanSeeds are message arrays that exercise cleanMessages' rules.
var cleanSeeds = []string{
	`[{"role":"user","content":"hi"}]`,
	`[{"role":"system","content":"a","name":null},{"role":"user","content":[{"type":"text","text":"b"}]}]`,
	`[{"role":"assistant","content":"x","reasoning":"r1","thinking":"r2"}]`,
	`[{"role":"assistant","reasoning_content":null,"reasoning":"r","content":"x","thinking":"t","thinking":"u"}]`,
	`[{"role":"tool","content":"<b>&amp;</b>","tool_call_id":"1"},{"role":"user","content":"\u00e9\ud800"}]`,
	"[{\"role\":\"user\",\"content\":\"\xff\xfe\",\"k\xff\":1}]",
	` [ { "role" : "user" , "content" : "spaced" } ] `,
	`[{"a":1,"a":2,"a":null}]`,
	`[]`, `[1]`, `["x"]`, `[{"a":1},2]`, `{}`, `null`, `[{"a":1}] x`, `[{"a":}]`, `[{"a":1}`, ``,
}

// FuzzCleanMessages: cleanMessages and its encoding/json form accept the
// same inputs and write the same messages.
func FuzzCleanMessages(f *testing.F) {
	for _, s := range cleanSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkCleanMessages)
}

func checkCleanMessages(t *testing.T, raw []byte) {
	t.Helper()
	want, wantErr := referenceCleanMessages(raw)
	got, err := cleanMessages(raw)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("%q: error %v, encoding/json's %v", raw, err, wantErr)
	}
	if err != nil {
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("%q: error %v does not wrap ErrInvalid", raw, err)
		}
		return
	}
	g, err := canonicalJSON(got)
	if err != nil {
		t.Fatalf("%q: cleanMessages wrote invalid JSON %q: %v", raw, got, err)
	}
	w, err := canonicalJSON(want)
	if err != nil {
		t.Fatalf("%q: reference wrote invalid JSON %q: %v", raw, want, err)
	}
	if g != w {
		t.Fatalf("%q: wrote %s, encoding/json %s", raw, got, want)
	}
}
