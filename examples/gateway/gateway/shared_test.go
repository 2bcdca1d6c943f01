package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/router"
)

// headerFrontend is a frontend in front of fake engines, all behind one
// URL, that serves each request on the engine its
// X-Dynamo-Worker-Instance-Id header names, as Dynamo's frontend does in
// direct routing mode: an unknown or missing id is answered 400 with
// Dynamo's message. It records the routing headers of every request.
type headerFrontend struct {
	srv     *httptest.Server
	client  *http.Client
	engines map[kvroute.WorkerID]string // engine URLs

	mu   sync.Mutex
	seen []http.Header
}

func newHeaderFrontend(t *testing.T, engines []*fakeEngine) *headerFrontend {
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	f := &headerFrontend{client: &http.Client{Transport: transport}, engines: map[kvroute.WorkerID]string{}}
	for _, e := range engines {
		f.engines[e.ID()] = e.URL()
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// serve relays a request to the engine its header names, one flush per
// read of the engine's answer (streams arrive as they are sent).
func (f *headerFrontend) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		return
	}
	f.mu.Lock()
	f.seen = append(f.seen, r.Header.Clone())
	f.mu.Unlock()
	id, err := strconv.ParseUint(r.Header.Get("X-Dynamo-Worker-Instance-Id"), 10, 64)
	base, ok := f.engines[kvroute.WorkerID(id)]
	if err != nil || !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"message":"Invalid request","type":"Bad Request","code":400}`)
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, base+r.URL.Path, r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	out.Header = r.Header.Clone()
	resp, err := f.client.Do(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = http.NewResponseController(w).Flush()
		}
		if err != nil {
			return
		}
	}
}

func (f *headerFrontend) headers() []http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]http.Header(nil), f.seen...)
}

// Engines that share one URL are told apart by the preset's headers: the
// gateway routes on their KV events, the frontend serves each request on
// the engine the router chose, a client's own routing headers never reach
// it, and a worker the frontend does not know fails over to another.
func TestGatewaySharedURLWithWorkerHeaders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	engines := []*fakeEngine{
		newFakeEngine(t, 6102808441099218236, blockSize, 64, 4, time.Millisecond),
		newFakeEngine(t, 15810847705965030232, blockSize, 64, 4, time.Millisecond),
	}
	front := newHeaderFrontend(t, engines)
	r, err := router.New(router.Config{
		Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: blockSize}),
		Health: router.HealthConfig{DegradedErrors: 1}, // one refusal is enough to look elsewhere
	})
	require.NoError(t, err)
	var cfg gateway.Config
	cfg.Router = r
	for _, e := range engines {
		cfg.Engines = append(cfg.Engines, gateway.Engine{
			ID: e.ID(), URL: front.srv.URL, Events: e.Events(), Replay: e.Replay(), Topic: "kv-events",
			Preset: gateway.PresetDynamo,
		})
	}
	// A worker the frontend does not know (gone since it was added).
	const ghost = kvroute.WorkerID(77)
	cfg.Engines = append(cfg.Engines, gateway.Engine{ID: ghost, URL: front.srv.URL, Preset: gateway.PresetDynamo})
	cfg.HealthInterval = 50 * time.Millisecond
	// A probe slower than the interval on a loaded machine must not fail:
	// the error would make the ghost degraded before any refusal, and the
	// router would never try it.
	cfg.HealthTimeout = 10 * time.Second
	gw, err := gateway.New(cfg)
	require.NoError(t, err)
	c := &cluster{router: r, gw: gw, engines: engines, client: &http.Client{Timeout: 15 * time.Second}}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- gw.Run(runCtx) }()
	c.srv = httptest.NewServer(gw)
	t.Cleanup(func() {
		c.srv.Close()
		stop()
		require.NoError(t, <-ran)
	})
	c.waitConnected(t, ctx)

	spoof := func(req *http.Request) {
		req.Header.Set("X-Dynamo-Worker-Instance-Id", "1")
		req.Header.Set("X-Worker-Instance-Id", "1")
		req.Header.Set("X-Dynamo-Prefill-Instance-Id", "1")
		req.Header.Set("X-Data-Parallel-Rank", "3")
	}
	system := "you are a careful assistant who answers in full sentences and checks every fact twice before replying to anyone"
	byWorker := map[string]int{}
	for i := range 12 {
		body := map[string]any{"model": "m", "max_tokens": 4, "stream": i%2 == 0, "stream_options": map[string]bool{"include_usage": i%2 == 0},
			"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": fmt.Sprint("question number ", i)}}}
		a, err := callWith(ctx, c.client, c.srv.URL, "/v1/chat/completions", body, i, spoof)
		require.NoError(t, err)
		require.True(t, a.ok, "request %d: %+v", i, a)
		require.NotEqual(t, fmt.Sprint(ghost, "/0"), a.worker)
		byWorker[a.worker]++
		if i > 0 {
			require.Positive(t, a.usage.PromptTokensDetails.CachedTokens, "request %d: the shared system prompt is cached on its engine", i)
			require.Positive(t, a.predicted, "request %d: the router predicted the hit", i)
		}
		c.waitSynced(t, ctx)
	}
	require.Len(t, byWorker, 1, "one prefix, one engine: %v", byWorker)
	// Fresh prompts until the router has tried the unknown worker.
	tried := func() bool {
		for _, h := range front.headers() {
			if h.Get("X-Dynamo-Worker-Instance-Id") == "77" {
				return true
			}
		}
		return false
	}
	for i := 0; !tried(); i++ {
		require.Less(t, i, 50, "the router never chose the unknown worker")
		body := map[string]any{"model": "m", "max_tokens": 4, "prompt": fmt.Sprint("fresh prompt ", i, " with its own words")}
		a, err := call(ctx, c.client, c.srv.URL, "/v1/completions", body, 100+i)
		require.NoError(t, err)
		require.True(t, a.ok, "fresh request %d: %+v", i, a)
	}

	seen := front.headers()
	ghostTries := 0
	for _, h := range seen {
		id := h.Get("X-Dynamo-Worker-Instance-Id")
		require.Contains(t, []string{"6102808441099218236", "15810847705965030232", "77"}, id)
		require.Equal(t, "0", h.Get("X-Dynamo-Dp-Rank"))
		for _, name := range []string{"X-Worker-Instance-Id", "X-Dynamo-Prefill-Instance-Id", "X-Data-Parallel-Rank"} {
			require.Empty(t, h.Get(name), "the client's %s reached the frontend", name)
		}
		if id == "77" {
			ghostTries++
		}
	}
	st := gw.Stats()
	require.Equal(t, uint64(ghostTries), st.Retries, "each refusal moved its request to another engine")
	require.Zero(t, st.Failed)
	h, _ := r.Health(kvroute.WorkerKey{ID: ghost})
	require.NotEqual(t, router.Healthy, h, "the refusals count against the unknown worker")
}

// frontendRouter starts two engines (ids 11 and 12) behind one header
// frontend, and a router with both as its workers of ranks data-parallel
// ranks each (0 is one), as a discovery source would register them.
func frontendRouter(t *testing.T, ranks int) ([]*fakeEngine, *headerFrontend, *router.Router) {
	t.Helper()
	engines := []*fakeEngine{
		newFakeEngine(t, 11, blockSize, 64, 2, 0),
		newFakeEngine(t, 12, blockSize, 64, 2, 0),
	}
	front := newHeaderFrontend(t, engines)
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: blockSize})})
	require.NoError(t, err)
	for _, e := range engines {
		require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: e.ID(), Ranks: ranks, Block: blockSize}))
	}
	return engines, front, r
}

// Workers a discovery source registers in the router (here the test) are
// served through Config.Frontend with their own headers, and its health
// probe keeps them alive.
func TestGatewayFrontendServesDiscoveredWorkers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	engines, front, r := frontendRouter(t, 0)
	gw, err := gateway.New(gateway.Config{Router: r, HealthInterval: 10 * time.Millisecond,
		Frontend: &gateway.Engine{URL: front.srv.URL, Preset: gateway.PresetDynamo}})
	require.NoError(t, err)
	_, err = gateway.New(gateway.Config{Router: r, Frontend: &gateway.Engine{URL: "tcp://x", Preset: gateway.PresetDynamo}})
	require.ErrorIs(t, err, gateway.ErrConfig)

	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- gw.Run(runCtx) }()
	srv := httptest.NewServer(gw)
	defer func() {
		srv.Close()
		stop()
		require.NoError(t, <-ran)
	}()
	client := &http.Client{Timeout: 10 * time.Second}
	served := map[string]bool{}
	for i := range 8 {
		a, err := call(ctx, client, srv.URL, "/v1/completions", map[string]any{"model": "m", "prompt": fmt.Sprint("prompt ", i)}, i)
		require.NoError(t, err)
		require.True(t, a.ok, "%+v", a)
		served[a.worker] = true
	}
	for _, h := range front.headers() {
		require.Contains(t, []string{"11", "12"}, h.Get("X-Dynamo-Worker-Instance-Id"))
	}
	require.Equal(t, map[string]bool{"11/0": true, "12/0": true}, served, "both workers get fresh prompts")
	st := gw.Stats()
	require.Empty(t, st.Engines)
	require.Len(t, st.Frontend, 2)
	for i, es := range st.Frontend {
		require.Equal(t, engines[i].ID(), es.Engine.ID)
		require.Equal(t, front.srv.URL, es.Engine.URL)
		require.Equal(t, []router.Health{router.Healthy}, es.Health)
	}
	require.Eventually(t, func() bool {
		for _, ws := range r.Stats().Workers {
			if ws.Health != router.Healthy {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond)
}

// A worker whose data-parallel ranks start at 4 (Dynamo's second node of a
// multi-node deployment) is routed as ranks 0 and 1 and forwarded with the
// ranks Dynamo's frontend knows, 4 and 5, in X-Dynamo-Dp-Rank; a worker
// whose ranks start at 0 keeps its ranks.
func TestGatewayFrontendDPStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, front, r := frontendRouter(t, 2)
	starts := map[uint64]int{12: 4}
	gw, err := gateway.New(gateway.Config{Router: r, HealthInterval: -1,
		Frontend:        &gateway.Engine{URL: front.srv.URL, Preset: gateway.PresetDynamo},
		FrontendDPStart: func(w uint64) int { return starts[w] }})
	require.NoError(t, err)
	srv := httptest.NewServer(gw)
	defer srv.Close()
	client := &http.Client{Timeout: 10 * time.Second}
	for i := range 16 {
		a, err := call(ctx, client, srv.URL, "/v1/completions", map[string]any{"model": "m", "prompt": fmt.Sprint("prompt ", i)}, i)
		require.NoError(t, err)
		require.True(t, a.ok, "%+v", a)
	}
	seen := map[string]bool{}
	for _, h := range front.headers() {
		seen[h.Get("X-Dynamo-Worker-Instance-Id")+"/"+h.Get("X-Dynamo-Dp-Rank")] = true
	}
	for k := range seen {
		require.Contains(t, []string{"11/0", "11/1", "12/4", "12/5"}, k)
	}
	require.True(t, seen["12/4"] || seen["12/5"], "the offset worker was chosen: %v", seen)
	require.True(t, seen["11/0"] || seen["11/1"], "%v", seen)
}
