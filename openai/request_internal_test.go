package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
)

// The encoding/json forms of ParseRequest and Rewrite: the oracles of
// TestParseRequestAgreesWithEncodingJSON and FuzzParseRequestAgrees.

func referenceParseRequest(body []byte, kind Kind) (*Request, error) {
	if kind != KindCompletion && kind != KindChat {
		return nil, fmt.Errorf("%w: unknown request kind %d", ErrBadRequest, kind)
	}
	r := &Request{Kind: kind}
	if err := json.Unmarshal(body, &r.Fields); err != nil {
		return nil, fmt.Errorf("%w: body is not a JSON object: %w", ErrBadRequest, err)
	}
	if r.Fields == nil {
		return nil, fmt.Errorf("%w: body is null", ErrBadRequest)
	}
	if err := field(r.Fields, "model", &r.Model); err != nil {
		return nil, err
	}
	if err := field(r.Fields, "stream", &r.Stream); err != nil {
		return nil, err
	}
	if err := field(r.Fields, "cache_salt", &r.CacheSalt); err != nil {
		return nil, err
	}
	var opts struct {
		IncludeUsage *bool `json:"include_usage"`
	}
	if err := field(r.Fields, "stream_options", &opts); err != nil {
		return nil, err
	}
	r.IncludeUsage = opts.IncludeUsage != nil && *opts.IncludeUsage
	for _, name := range []string{"max_tokens", "max_completion_tokens"} {
		var n *int
		if err := field(r.Fields, name, &n); err != nil {
			return nil, err
		}
		if n != nil {
			r.MaxTokens = max(*n, 0)
		}
	}
	if kind == KindCompletion {
		return r, r.parsePrompt(r.Fields["prompt"])
	}
	return r, r.referenceParseChat()
}

func (r *Request) referenceParseChat() error {
	raw, ok := r.Fields["messages"]
	if !ok || isNull(raw) {
		return fmt.Errorf("%w: no messages", ErrBadRequest)
	}
	var msgs []struct {
		Role *string `json:"role"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return fmt.Errorf("%w: messages: %w", ErrBadRequest, err)
	}
	if len(msgs) == 0 {
		return fmt.Errorf("%w: no messages", ErrBadRequest)
	}
	if len(msgs) > maxMessages {
		return fmt.Errorf("%w: %d messages, more than %d", ErrBadRequest, len(msgs), maxMessages)
	}
	for i, m := range msgs {
		if m.Role == nil {
			return fmt.Errorf("%w: message %d has no role", ErrBadRequest, i)
		}
	}
	r.Messages = raw
	if t, ok := r.Fields["tools"]; ok && !isNull(t) {
		var tools []json.RawMessage
		if err := json.Unmarshal(t, &tools); err != nil {
			return fmt.Errorf("%w: tools: %w", ErrBadRequest, err)
		}
		r.Tools = t
	}
	if k, ok := r.Fields["chat_template_kwargs"]; ok && !isNull(k) {
		var kw map[string]json.RawMessage
		if err := json.Unmarshal(k, &kw); err != nil {
			return fmt.Errorf("%w: chat_template_kwargs: %w", ErrBadRequest, err)
		}
		r.ChatTemplateKwargs = k
	}
	return nil
}

func (r *Request) referenceRewrite(includeUsage bool) ([]byte, bool, error) {
	fields := make(map[string]json.RawMessage, len(r.Fields)+1)
	for k, v := range r.Fields {
		fields[k] = v
	}
	changed := r.modelSet
	if includeUsage && r.Stream && !r.IncludeUsage {
		opts := map[string]json.RawMessage{}
		if err := field(r.Fields, "stream_options", &opts); err != nil {
			return nil, false, err
		}
		opts["include_usage"] = json.RawMessage("true")
		raw, err := json.Marshal(opts)
		if err != nil {
			return nil, false, fmt.Errorf("%w: stream_options: %w", ErrBadRequest, err)
		}
		fields["stream_options"], changed = raw, true
	}
	if !changed {
		return nil, false, nil
	}
	body, err := json.Marshal(fields)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return body, true, nil
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
	`{"messages":[{"role":"u"}],"tools":{}}`,
	`{"messages":[{"role":"u"}],"chat_template_kwargs":[]}`,
	`{"messages":[{"role":"u"}],"tools":null,"chat_template_kwargs":null}`,
	"{\"messages\":[{\"role\":\"\xff\"}],\"k\xff\":\"\\ud800\"}",
	` { "prompt" : "spaced" , "stream" : false } `,
	`{"prompt":"x"} {}`, `{"prompt":"x"`, `null`, ` null `, `[]`, `"x"`, `1`, ``, `{"prompt":"a","stream_options":{"include_usage":false}}`,
	`{"prompt":"<b>&</b>","stream":true,"stream_options":{"x":[1, 2]}}`,
	`{"\u006dodel":"m","prompt":"p"}`,
}

func TestParseRequestAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range requestSeeds {
		checkParseRequest(t, []byte(s), true)
		checkParseRequest(t, []byte(s), false)
	}
}

// FuzzParseRequestAgrees: ParseRequest and its encoding/json form accept
// the same bodies and read the same request from them, and Rewrite writes
// the same JSON as its encoding/json form.
func FuzzParseRequestAgrees(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s), true)
	}
	f.Fuzz(checkParseRequest)
}

func checkParseRequest(t *testing.T, body []byte, chat bool) {
	t.Helper()
	kind := KindCompletion
	if chat {
		kind = KindChat
	}
	want, wantErr := referenceParseRequest(body, kind)
	got, err := ParseRequest(body, kind)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("%q: error %v, encoding/json's %v", body, err, wantErr)
	}
	if err != nil {
		if !errors.Is(err, ErrBadRequest) {
			t.Fatalf("%q: error %v does not wrap ErrBadRequest", body, err)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: read %+v, encoding/json %+v", body, got, want)
	}
	gotBody, gotChanged, err := got.Rewrite(true)
	wantBody, wantChanged, wantErr := want.referenceRewrite(true)
	if (err != nil) != (wantErr != nil) || gotChanged != wantChanged {
		t.Fatalf("%q: Rewrite changed %v, error %v; encoding/json's %v, %v", body, gotChanged, err, wantChanged, wantErr)
	}
	if err == nil && gotChanged {
		var g, w any
		if err := json.Unmarshal(gotBody, &g); err != nil {
			t.Fatalf("%q: Rewrite wrote invalid JSON %q: %v", body, gotBody, err)
		}
		if err := json.Unmarshal(wantBody, &w); err != nil {
			t.Fatalf("%q: encoding/json wrote invalid JSON %q: %v", body, wantBody, err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("%q: Rewrite wrote %s, encoding/json %s", body, gotBody, wantBody)
		}
	}
}
