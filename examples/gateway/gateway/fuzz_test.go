package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/openai"
)

// FuzzParseEngine parses engine specifications as the command line gives
// them. An accepted one has an http(s) URL, non-negative capacities, a
// replay endpoint only with an events endpoint, and an endpoint for each
// rank; a rejected one wraps ErrEngineConfig. Parsing stays fast for any
// rank count.
func FuzzParseEngine(f *testing.F) {
	f.Add("1=http://127.0.0.1:8000,events=tcp://127.0.0.1:5557")
	f.Add("6102808441099218236=http://127.0.0.1:8000,preset=dynamo,header=X-Pick:{id}/{rank}")
	f.Add("2=https://engine:8443,zmq=tcp://e:5557,replay=tcp://e:5558,topic=kv-events,ranks=4,max-requests=256,max-batched-tokens=8192,kv-blocks=27910")
	f.Add("3=http://e,ranks=9223372036854775807")
	f.Add("4=http://e,replay=tcp://e:1")
	f.Add("x=ftp://e")
	f.Add("5=http://e,ranks=-1,kv-blocks=x")
	f.Fuzz(func(t *testing.T, spec string) {
		e, err := ParseEngine(spec)
		if err != nil {
			if !errors.Is(err, ErrEngineConfig) {
				t.Fatalf("error %q does not wrap ErrEngineConfig", err)
			}
			return
		}
		// Schemes are case-insensitive (RFC 3986 3.1): "HTTP://e" is http.
		if u, err := url.Parse(e.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			t.Fatalf("accepted URL %q", e.URL)
		}
		if e.Ranks < 0 || e.MaxRequests < 0 || e.MaxBatchedTokens < 0 || e.KVCapacityBlocks < 0 {
			t.Fatalf("accepted negative numbers: %+v", e)
		}
		if e.Replay != "" && e.Events == "" {
			t.Fatalf("accepted replay without events: %+v", e)
		}
		if e.Events != "" {
			last, err := rankEndpoint(e.Events, max(e.Ranks, 1)-1)
			if err != nil {
				t.Fatalf("accepted engine without an endpoint for its last rank: %v", err)
			}
			if e.Ranks > 1 {
				port, err := strconv.Atoi(last[strings.LastIndexByte(last, ':')+1:])
				if err != nil || port < e.Ranks || port > 65535 {
					t.Fatalf("last rank's endpoint %q has no valid port", last)
				}
			}
		}
	})
}

// FuzzParseAPIRequest parses completion and chat request bodies as the
// gateway receives them from clients. A rejected body wraps ErrBadRequest;
// an accepted one has a prompt (text, token ids or messages) and a
// non-negative max_tokens, its forwarded body is a JSON object, and so is
// the body with token ids for Dynamo's frontend, which carries them in
// nvext.token_data unless the client's nvext is not an object.
func FuzzParseAPIRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":"hello world","max_tokens":16,"stream":true}`), false)
	f.Add([]byte(`{"model":"m","prompt":[[1,2,3]],"cache_salt":"s"}`), false)
	f.Add([]byte(`{"model":"m","prompt":["a","b"]}`), false)
	f.Add([]byte(`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_completion_tokens":-3,"stream":true,"stream_options":{"include_usage":false}}`), true)
	f.Add([]byte(`{"messages":[]}`), true)
	f.Add([]byte(`[1]`), true)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		kind := openai.KindCompletion
		if chat {
			kind = openai.KindChat
		}
		r, err := parseRequest(body, kind)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %q does not wrap ErrBadRequest", err)
			}
			return
		}
		if r.MaxTokens < 0 {
			t.Fatalf("max tokens %d", r.MaxTokens)
		}
		if chat && len(r.Messages) == 0 {
			t.Fatal("chat request accepted without messages")
		}
		fwd, err := r.forwardBody(body)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("forward body: error %q does not wrap ErrBadRequest", err)
			}
			return
		}
		if _, err := parseRequest(fwd, kind); err != nil {
			t.Fatalf("forwarded body %q does not parse again: %v", fwd, err)
		}
		r.tokens = []uint32{1, 20, 300}
		withTokens := r.bodyFor(&engineHeaders{tokenData: true}, fwd)
		again, err := parseRequest(withTokens, kind)
		if err != nil {
			t.Fatalf("body with token ids %q does not parse again: %v", withTokens, err)
		}
		if !bytes.Equal(again.Messages, r.Messages) {
			t.Fatalf("body with token ids %q changed the messages %q", withTokens, r.Messages)
		}
		if r.tokens == nil {
			return // the client's nvext is not an object: sent as it came
		}
		var nvext struct {
			TokenData []uint32 `json:"token_data"`
		}
		if err := json.Unmarshal(again.Fields["nvext"], &nvext); err != nil || !slices.Equal(nvext.TokenData, []uint32{1, 20, 300}) {
			t.Fatalf("body with token ids %q: nvext %s (%v)", withTokens, again.Fields["nvext"], err)
		}
	})
}

// recordHooks records what an sseBody reports.
type recordHooks struct {
	chunks   int
	failures int
}

var fuzzFailedEvent = []byte("data: {\"error\":\"upstream\"}\n\ndata: [DONE]\n\n")

func (h *recordHooks) chunk(*openai.Event) { h.chunks++ }

func (h *recordHooks) failed(error) []byte {
	h.failures++
	return fuzzFailedEvent
}

// FuzzSSEBody relays an engine's event stream through the gateway's SSE
// reader. Without dropping usage chunks, the client receives the upstream
// bytes unchanged, up to the point where the stream broke and then one
// error event; with dropping, it receives no more than that. A stream
// breaks at most once, and no event held in memory exceeds maxEventBytes.
func FuzzSSEBody(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n"), true)
	f.Add([]byte(": keep-alive\r\n\r\ndata: {\"error\":{\"message\":\"x\"}}\r\n\r\n"), false)
	f.Add([]byte("data: {\"choices\":[1]}\n\ndata: partial"), false)
	f.Add([]byte("data: a\ndata: b\n\nevent: x\n\n"), true)
	f.Add(append([]byte("data: "), bytes.Repeat([]byte("x"), 70<<10)...), false)
	f.Fuzz(func(t *testing.T, in []byte, dropUsage bool) {
		h := &recordHooks{}
		b := newSSEBody(io.NopCloser(bytes.NewReader(in)), h, dropUsage)
		var out []byte
		buf := make([]byte, 512)
		for {
			n, err := b.Read(buf)
			out = append(out, buf[:n]...)
			held := len(b.pending)
			for _, ev := range b.queue {
				held += len(ev)
			}
			if held > 2*maxEventBytes+64<<10 {
				t.Fatalf("%d bytes held", held)
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("read: %v (failed hook returned an event)", err)
			}
			if len(out) > len(in)+len(fuzzFailedEvent) {
				t.Fatalf("%d bytes relayed from %d", len(out), len(in))
			}
		}
		if h.failures > 1 {
			t.Fatalf("stream failed %d times", h.failures)
		}
		relayed := out
		if h.failures == 1 {
			var ok bool
			if relayed, ok = bytes.CutSuffix(out, fuzzFailedEvent); !ok {
				t.Fatalf("broken stream does not end with the error event: %q", out)
			}
		}
		if len(relayed) > len(in) {
			t.Fatalf("%d bytes relayed from %d", len(relayed), len(in))
		}
		if !dropUsage {
			if !bytes.HasPrefix(in, relayed) {
				t.Fatalf("relayed %q is not a prefix of %q", relayed, in)
			}
			if h.failures == 0 && !bytes.Equal(relayed, in) {
				t.Fatalf("clean stream relayed as %q, sent %q", relayed, in)
			}
		}
	})
}

// FuzzDynamoRefused reads answers of Dynamo's frontend as the Dynamo
// preset judges them: only a 400 whose JSON message is Dynamo's refusal
// of an unknown worker counts as one, and nothing panics.
func FuzzDynamoRefused(f *testing.F) {
	f.Add(400, []byte(`{"message":"Invalid request","type":"Bad Request","code":400}`))
	f.Add(400, []byte(`{"message":"Failed to deserialize the JSON body into the target type: invalid value","type":"Bad Request","code":400}`))
	f.Add(404, []byte(`{"message":"Model not found","type":"Not Found","code":404}`))
	f.Add(400, []byte(`{"message":"Invalid request"`))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		got := dynamoRefused(status, body)
		if got && status != 400 {
			t.Fatalf("status %d judged a refusal", status)
		}
		if got && !bytes.Contains(body, []byte("Invalid request")) {
			t.Fatalf("body %q judged a refusal", body)
		}
	})
}
