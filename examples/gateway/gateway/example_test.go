package gateway_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
)

// Put a gateway in front of one OpenAI-compatible engine (here a stub that
// answers every completion the same way) and send it a request.
func Example() {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"text":" world"}],"usage":{"prompt_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`)
	}))
	defer engine.Close()

	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	if err != nil {
		panic(err)
	}
	gw, err := gateway.New(gateway.Config{
		Router:  r,
		Engines: []gateway.Engine{{ID: 1, URL: engine.URL}}, // add Events: "tcp://…" for KV events
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go gw.Run(ctx) // KV-event subscribers and health probes
	srv := httptest.NewServer(gw)
	defer srv.Close()

	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hello"}`))
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.Status, "from worker", resp.Header.Get(gateway.HeaderWorker))
	fmt.Println(string(body))
	// Output:
	// 200 OK from worker 1/0
	// {"choices":[{"text":" world"}],"usage":{"prompt_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}
}

func ExampleParseEngine() {
	e, err := gateway.ParseEngine("2=http://10.0.0.8:8000,events=tcp://10.0.0.8:5557,replay=tcp://10.0.0.8:5558,ranks=2")
	if err != nil {
		panic(err)
	}
	fmt.Printf("%+v\n", e)
	// Output:
	// {ID:2 URL:http://10.0.0.8:8000 Events:tcp://10.0.0.8:5557 Replay:tcp://10.0.0.8:5558 Topic: Ranks:2 Headers:map[] Preset: MaxRequests:0 MaxBatchedTokens:0 KVCapacityBlocks:0}
}

func ExampleWordTokenizer() {
	req, err := openai.ParseRequest([]byte(`{"model":"m","prompt":"the cat the"}`), openai.KindCompletion)
	if err != nil {
		panic(err)
	}
	tokens, _ := gateway.WordTokenizer{}.Tokenize(context.Background(), req, nil)
	fmt.Println(len(tokens), tokens[0] == tokens[2])
	// Output:
	// 3 true
}

// Route the workers of an NVIDIA Dynamo deployment through its frontend
// (started with --router-mode direct): the workers are registered in the
// router under their instance ids (here by hand; package discovery/dynamo
// does it from Dynamo's store), and each request reaches the frontend with
// the chosen worker in x-dynamo-worker-instance-id. The frontend here is a
// stub that answers with the header it received.
func ExampleConfig_frontend() {
	frontend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"text":"served by %s"}]}`, r.Header.Get(gateway.HeaderDynamoWorker))
	}))
	defer frontend.Close()

	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	if err != nil {
		panic(err)
	}
	if err := r.AddWorker(router.StaticWorker{WorkerID: 6102808441099218236, Block: 16}); err != nil {
		panic(err)
	}
	gw, err := gateway.New(gateway.Config{
		Router:   r,
		Frontend: &gateway.Engine{URL: frontend.URL, Preset: gateway.PresetDynamo},
	})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(gw)
	defer srv.Close()

	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"tiny","prompt":"hello"}`))
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(string(body))
	// Output:
	// {"choices":[{"text":"served by 6102808441099218236"}]}
}
