package router_test

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/zmq"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// engineAddr is how a host knows one of its engines.
type engineAddr struct {
	ID             kvroute.WorkerID
	URL            string // OpenAI-compatible HTTP endpoint
	Events, Replay string // ZMQ KV-event PUB and replay ROUTER endpoints
}

// A complete host integration: register the engines, ingest their KV events,
// check health, and route every request. tokenize and proxy stand for the
// host's tokenizer and HTTP client.
func Example_hostIntegration() {
	ctx := context.Background()
	engines := map[kvroute.WorkerID]engineAddr{1: {1, "http://10.0.0.1:8000", "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558"}}
	tokenize := func(*http.Request) []uint32 { return nil }
	proxy := func(w io.Writer, r *http.Request, url string, firstToken func()) (cachedTokens int, err error) {
		return 0, nil
	}

	r, _ := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16}),
		Busy: scheduling.BusyThresholds{PrefillTokens: 2}})
	for _, e := range engines {
		_ = r.AddWorker(router.StaticWorker{WorkerID: e.ID, Block: 16, BatchedTokens: 8192})
		sub, _ := zmq.New(zmq.Config{Endpoint: e.Events, ReplayEndpoint: e.Replay,
			Converter: kvevents.ConverterConfig{Worker: e.ID, BlockSize: 16}, Sink: r.Index()})
		go sub.Run(ctx)
	}
	go r.RunHealthChecks(ctx, time.Second)
	http.HandleFunc("/v1/completions", func(w http.ResponseWriter, req *http.Request) {
		d, err := r.Select(req.Context(), &router.Request{Tokens: tokenize(req)})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		cached, err := proxy(w, req, engines[d.Worker.ID].URL, d.PrefillDone)
		d.Done(router.Outcome{Err: err, CachedTokens: cached, CachedTokensKnown: err == nil})
	})
	_ = http.ListenAndServe(":8080", nil)
}
