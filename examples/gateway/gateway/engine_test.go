package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
)

func TestParseEngine(t *testing.T) {
	tests := []struct {
		spec    string
		want    gateway.Engine
		wantErr string
	}{
		{spec: "1=http://127.0.0.1:8000", want: gateway.Engine{ID: 1, URL: "http://127.0.0.1:8000"}},
		{spec: "7=http://h:8000,zmq=tcp://h:5557,replay=tcp://h:5558,topic=kv-events,ranks=2,max-requests=256,max-batched-tokens=8192,kv-blocks=1000",
			want: gateway.Engine{ID: 7, URL: "http://h:8000", Events: "tcp://h:5557", Replay: "tcp://h:5558", Topic: "kv-events",
				Ranks: 2, MaxRequests: 256, MaxBatchedTokens: 8192, KVCapacityBlocks: 1000}},
		{spec: "2=https://h,events=tcp://h:1", want: gateway.Engine{ID: 2, URL: "https://h", Events: "tcp://h:1"}},
		{spec: "6102808441099218236=http://127.0.0.1:8000,preset=dynamo",
			want: gateway.Engine{ID: 6102808441099218236, URL: "http://127.0.0.1:8000", Preset: gateway.PresetDynamo}},
		{spec: "18446744073709551615=http://h:8000,header=X-Worker:w{id},header=x-rank: {rank}",
			want: gateway.Engine{ID: 18446744073709551615, URL: "http://h:8000", Headers: map[string]string{"X-Worker": "w{id}", "x-rank": "{rank}"}}},
		{spec: "1=http://h,preset=dynamo,header=X-Dynamo-Dp-Rank:0",
			want: gateway.Engine{ID: 1, URL: "http://h", Preset: gateway.PresetDynamo, Headers: map[string]string{"X-Dynamo-Dp-Rank": "0"}}},
		{spec: "1=http://h,preset=sglang", wantErr: `unknown preset "sglang"`},
		{spec: "1=http://h,header=X-Worker", wantErr: "not NAME:VALUE"},
		{spec: "1=http://h,header=X Worker:1", wantErr: "invalid header name"},
		{spec: "1=http://h,header=:1", wantErr: "invalid header name"},
		{spec: "http://h:8000", wantErr: "id"},
		{spec: "x=http://h:8000", wantErr: "id"},
		{spec: "1", wantErr: "ID=URL"},
		{spec: "1=h:8000", wantErr: "not http(s)"},
		{spec: "1=http://h,color=red", wantErr: "unknown option"},
		{spec: "1=http://h,ranks", wantErr: "not key=value"},
		{spec: "1=http://h,ranks=two", wantErr: "ranks"},
		{spec: "1=http://h,ranks=-1", wantErr: "negative"},
		{spec: "1=http://h,replay=tcp://h:2", wantErr: "without an events endpoint"},
		{spec: "1=http://h,events=ipc:///tmp/kv,ranks=2", wantErr: "no port to offset"},
		{spec: "1=http://h,events=tcp://h:65535,ranks=2", wantErr: "no port to offset"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := gateway.ParseEngine(tt.spec)
			if tt.wantErr != "" {
				require.ErrorIs(t, err, gateway.ErrEngineConfig)
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

// Header templates expand per attempt, a preset's headers yield to the
// engine's own, and names that differ only in case are refused.
func TestEngineHeaders(t *testing.T) {
	tests := []struct {
		name    string
		engine  gateway.Engine
		want    map[string]string // headers the engine receives
		wantErr string
	}{
		{name: "dynamo", engine: gateway.Engine{ID: 15810847705965030232, Preset: gateway.PresetDynamo},
			want: map[string]string{"X-Dynamo-Worker-Instance-Id": "15810847705965030232", "X-Dynamo-Dp-Rank": "0"}},
		{name: "template", engine: gateway.Engine{ID: 7, Headers: map[string]string{"x-pick": "worker-{id}/{rank}", "X-Static": "yes"}},
			want: map[string]string{"X-Pick": "worker-7/0", "X-Static": "yes"}},
		{name: "own header wins", engine: gateway.Engine{ID: 7, Preset: gateway.PresetDynamo, Headers: map[string]string{"x-dynamo-dp-rank": "5"}},
			want: map[string]string{"X-Dynamo-Worker-Instance-Id": "7", "X-Dynamo-Dp-Rank": "5"}},
		{name: "case duplicate", engine: gateway.Engine{ID: 7, Headers: map[string]string{"x-a": "1", "X-A": "2"}}, wantErr: "given twice"},
		{name: "bad value", engine: gateway.Engine{ID: 7, Headers: map[string]string{"x-a": "1\r\nX-B: 2"}}, wantErr: "invalid value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make(chan http.Header, 1)
			engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got <- r.Header.Clone()
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"choices":[{"text":"x"}]}`)
			}))
			defer engine.Close()
			r, err := router.New(router.Config{})
			require.NoError(t, err)
			tt.engine.URL = engine.URL
			gw, err := gateway.New(gateway.Config{Router: r, Engines: []gateway.Engine{tt.engine}})
			if tt.wantErr != "" {
				require.ErrorIs(t, err, gateway.ErrEngineConfig)
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			srv := httptest.NewServer(gw)
			defer srv.Close()
			resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi"}`))
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			h := <-got
			for name, value := range tt.want {
				require.Equal(t, []string{value}, h.Values(name), name)
			}
		})
	}
}

// An engine behind Dynamo's frontend (PresetDynamo) is sent the prompt's
// token ids in nvext.token_data, the ids the router matched, with the
// client's other nvext fields kept; an engine without the preset gets the
// body as the client sent it, and so does a Dynamo engine when the
// client's nvext is not an object (for the frontend to refuse).
func TestEngineTokenData(t *testing.T) {
	const prompt = `the cat sat on the mat`
	want, err := gateway.WordTokenizer{}.Tokenize(context.Background(), &openai.Request{Kind: openai.KindChat,
		Messages: json.RawMessage(`[{"role":"user","content":"` + prompt + `"}]`)}, nil)
	require.NoError(t, err)
	wantIDs := make([]any, len(want))
	for i, id := range want {
		wantIDs[i] = float64(id)
	}
	tests := []struct {
		name   string
		preset string
		nvext  string // the client's nvext, raw; empty: none
		want   any    // the nvext the engine receives; nil: none
	}{
		{name: "dynamo", preset: gateway.PresetDynamo, want: map[string]any{"token_data": wantIDs}},
		{name: "dynamo, client nvext kept", preset: gateway.PresetDynamo, nvext: `{"annotations":["request_id"]}`,
			want: map[string]any{"annotations": []any{"request_id"}, "token_data": wantIDs}},
		{name: "dynamo, client nvext not an object", preset: gateway.PresetDynamo, nvext: `"x"`, want: "x"},
		{name: "no preset", want: nil},
		{name: "no preset, client nvext", nvext: `{"annotations":[]}`, want: map[string]any{"annotations": []any{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make(chan map[string]any, 1)
			engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var body map[string]any
				_ = json.NewDecoder(r.Body).Decode(&body)
				got <- body
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"choices":[{"message":{"content":"x"}}]}`)
			}))
			defer engine.Close()
			r, err := router.New(router.Config{})
			require.NoError(t, err)
			gw, err := gateway.New(gateway.Config{Router: r, Engines: []gateway.Engine{{ID: 7, URL: engine.URL, Preset: tt.preset}}})
			require.NoError(t, err)
			srv := httptest.NewServer(gw)
			defer srv.Close()
			req := `{"model":"m","messages":[{"role":"user","content":"` + prompt + `"}]`
			if tt.nvext != "" {
				req += `,"nvext":` + tt.nvext
			}
			resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(req+"}"))
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			body := <-got
			require.Equal(t, tt.want, body["nvext"])
			require.Equal(t, []any{map[string]any{"role": "user", "content": prompt}}, body["messages"])
		})
	}
}
