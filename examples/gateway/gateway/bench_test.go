package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/router"
)

// BenchmarkChatRequest measures what the gateway spends on one streamed
// chat request with a system prompt of 1,400 words and a question of 200,
// tokenized with the llama3 family's tokenizer and chat template: reading
// and parsing it, tokenizing, routing, forwarding it to one of four
// engines and relaying their answer. The engines answer at once with a
// two-chunk stream, so the time is the gateway's (and the loopback
// hops'). It reports requests/s.
func BenchmarkChatRequest(b *testing.B) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"}}]}`+"\n\n")
		w.(http.Flusher).Flush()
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1900,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`+"\n\ndata: [DONE]\n\n")
	}))
	defer engine.Close()
	tok, err := gateway.LoadModelTokenizer(filepath.Join("..", "..", "..", "tokenizer", "testdata", "llama3"))
	if err != nil {
		b.Fatal(err)
	}
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	if err != nil {
		b.Fatal(err)
	}
	var engines []gateway.Engine
	for id := range kvroute.WorkerID(4) {
		engines = append(engines, gateway.Engine{ID: id + 1, URL: engine.URL})
	}
	gw, err := gateway.New(gateway.Config{Router: r, Engines: engines, Tokenizer: tok, HealthInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- gw.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			b.Error(err)
		}
	}()
	srv := httptest.NewServer(gw)
	defer srv.Close()

	words := strings.Fields(strings.Repeat("the router sends each request to the worker that already caches the longest prefix of its prompt unless that worker is too busy ", 70))
	body, err := json.Marshal(map[string]any{
		"model": "m", "stream": true, "max_tokens": 64,
		"messages": []map[string]string{
			{"role": "system", "content": strings.Join(words[:1400], " ")},
			{"role": "user", "content": strings.Join(words[1400:1600], " ")},
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	send := func() error {
		resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	}
	// Until the engines are registered and healthy.
	for deadline := time.Now().Add(10 * time.Second); send() != nil; {
		if time.Now().After(deadline) {
			b.Fatal(send())
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := send(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
}
