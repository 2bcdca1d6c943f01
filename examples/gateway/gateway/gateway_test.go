package gateway_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

const blockSize = 16

// testUsage is the usage object the client sees.
type testUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// answer is what one client request got back.
type answer struct {
	status int
	worker string
	ok     bool   // a complete, successful answer
	errMsg string // the error the client was told, if any
	chunks int    // streamed chunks with choices
	usage  *testUsage
	// predicted is the gateway's HeaderPredictedCached.
	predicted int
}

// call sends one request to the gateway and reads the whole answer. Its
// error means the client got no well-formed answer at all.
func call(ctx context.Context, client *http.Client, base, path string, body map[string]any, id int) (answer, error) {
	return callWith(ctx, client, base, path, body, id, nil)
}

// callWith is call with edit, when not nil, applied to the request.
func callWith(ctx context.Context, client *http.Client, base, path string, body map[string]any, id int, edit func(*http.Request)) (answer, error) {
	raw, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(raw))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", strconv.Itoa(id))
	if edit != nil {
		edit(req)
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, worker: resp.Header.Get(gateway.HeaderWorker)}
	a.predicted, _ = strconv.Atoi(resp.Header.Get(gateway.HeaderPredictedCached))
	var apiErr struct {
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
		Choices []json.RawMessage `json:"choices"`
		Usage   *testUsage        `json:"usage"`
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		if err := json.NewDecoder(resp.Body).Decode(&apiErr); err != nil {
			return a, fmt.Errorf("status %d with an unreadable body: %w", resp.StatusCode, err)
		}
		if apiErr.Error != nil {
			a.errMsg = apiErr.Error.Message
		}
		a.usage = apiErr.Usage
		a.ok = resp.StatusCode == http.StatusOK && a.errMsg == "" && len(apiErr.Choices) > 0
		if !a.ok && a.errMsg == "" {
			return a, fmt.Errorf("status %d without an error message", resp.StatusCode)
		}
		return a, nil
	}
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if done {
			return a, fmt.Errorf("data after [DONE]: %q", data)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		apiErr.Error, apiErr.Choices, apiErr.Usage = nil, nil, nil
		if err := json.Unmarshal([]byte(data), &apiErr); err != nil {
			return a, fmt.Errorf("chunk %q: %w", data, err)
		}
		if apiErr.Error != nil {
			a.errMsg = apiErr.Error.Message
		}
		if len(apiErr.Choices) > 0 {
			a.chunks++
		}
		if apiErr.Usage != nil {
			a.usage = apiErr.Usage
		}
	}
	if err := sc.Err(); err != nil {
		return a, fmt.Errorf("stream broken without an error event: %w", err)
	}
	if !done {
		return a, fmt.Errorf("stream ended without [DONE]")
	}
	a.ok = a.errMsg == "" && a.chunks > 0
	return a, nil
}

// words returns n deterministic words.
func words(rng *rand.Rand, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("w%d", rng.IntN(100000))
	}
	return strings.Join(w, " ")
}

// cluster is a gateway in front of fake engines, all on loopback.
type cluster struct {
	router  *router.Router
	gw      *gateway.Gateway
	srv     *httptest.Server
	engines []*fakeEngine
	client  *http.Client
}

// newCluster starts n fake engines (caches of 64 blocks, 8 streamed chunks
// 2 ms apart) and a gateway in front of them with a router made of rc.
func newCluster(t *testing.T, ctx context.Context, n int, rc router.Config, cfg gateway.Config, engineOpts func(int, *fakeEngine)) *cluster {
	rc.Hasher = kvroute.MustHasher(kvroute.HasherConfig{BlockSize: blockSize})
	r, err := router.New(rc)
	require.NoError(t, err)
	c := &cluster{router: r, client: &http.Client{Timeout: 15 * time.Second}}
	cfg.Router = r
	for i := range n {
		e := newFakeEngine(t, kvroute.WorkerID(i+1), blockSize, 64, 8, 2*time.Millisecond)
		if engineOpts != nil {
			engineOpts(i, e)
		}
		c.engines = append(c.engines, e)
		cfg.Engines = append(cfg.Engines, e.engine())
	}
	c.gw, err = gateway.New(cfg)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.gw.Run(runCtx) }()
	c.srv = httptest.NewServer(c.gw)
	t.Cleanup(func() {
		c.srv.Close()
		stop()
		require.NoError(t, <-ran)
	})
	return c
}

// waitConnected waits until every engine's subscriber is connected and
// its subscription has had time to reach the publisher: ZMQ drops what a
// PUB socket sends before it knows of a subscriber, and a subscriber that
// never received a first message has no sequence to ask the replay socket
// from, so a first event lost this way would never be indexed.
func (c *cluster) waitConnected(t *testing.T, ctx context.Context) {
	for {
		connected := 0
		for _, es := range c.gw.Stats().Engines {
			if es.Events.Reconnects > 0 {
				connected++
			}
		}
		if connected == len(c.engines) {
			time.Sleep(200 * time.Millisecond)
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("subscribers not connected: %+v", c.gw.Stats())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitSynced waits until the router's index has applied every event the
// engines published.
func (c *cluster) waitSynced(t *testing.T, ctx context.Context) {
	for {
		var published, applied int64
		for _, e := range c.engines {
			published += e.Published()
		}
		for _, es := range c.gw.Stats().Engines {
			applied += int64(es.Events.Applied)
		}
		if applied >= published {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d events applied: %+v", applied, published, c.gw.Stats())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// job is one request of a workload.
type job struct {
	i      int
	family int // system prompt × chat or completion: one token prefix
	path   string
	body   map[string]any
}

// sharedPrefixJobs returns n requests that each share one of prompts
// system prompts of systemWords words, in chat or completion form,
// streamed or not, each with its own question. The first 2×prompts are
// the first requests of each prefix family.
func sharedPrefixJobs(n, prompts, systemWords int) []job {
	rng := rand.New(rand.NewPCG(1, 2))
	system := make([]string, prompts)
	for i := range system {
		system[i] = words(rng, systemWords)
	}
	jobs := make([]job, n)
	for i := range jobs {
		p, chat := rng.IntN(prompts), i%2 == 0
		if i < 2*prompts {
			p = i / 2
		}
		question := words(rng, 20)
		j := job{i: i, family: 2 * p, body: map[string]any{"model": "m", "max_tokens": 8, "stream": i%3 != 0}}
		if chat {
			j.family++
			j.path = "/v1/chat/completions"
			j.body["messages"] = []map[string]string{{"role": "system", "content": system[p]}, {"role": "user", "content": question}}
		} else {
			j.path = "/v1/completions"
			j.body["prompt"] = system[p] + " " + question
		}
		if i%5 == 0 && i%3 != 0 {
			j.body["stream_options"] = map[string]bool{"include_usage": true}
		}
		jobs[i] = j
	}
	return jobs
}

// run sends the first warm jobs one at a time, waiting for their KV events
// to reach the index, and the rest concurrency at a time; before job
// killAt (when not zero) it kills engine 0. It returns what every request
// got.
func (c *cluster) run(t *testing.T, ctx context.Context, jobs []job, warm, concurrency, killAt int) ([]answer, []error) {
	answers, errs := make([]answer, len(jobs)), make([]error, len(jobs))
	for _, j := range jobs[:warm] {
		answers[j.i], errs[j.i] = call(ctx, c.client, c.srv.URL, j.path, j.body, j.i)
		require.NoError(t, errs[j.i])
		require.True(t, answers[j.i].ok, "%+v", answers[j.i])
		c.waitSynced(t, ctx)
	}
	queue := make(chan job)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for j := range queue {
				answers[j.i], errs[j.i] = call(ctx, c.client, c.srv.URL, j.path, j.body, j.i)
			}
		})
	}
	for _, j := range jobs[warm:] {
		if j.i == killAt && killAt > 0 {
			c.engines[0].kill()
		}
		queue <- j
	}
	close(queue)
	wg.Wait()
	return answers, errs
}

// foundCached returns the share of jobs whose engine found at least
// tokens of their prompt in its cache.
func (c *cluster) foundCached(jobs []job, tokens int) float64 {
	hits := 0
	for _, j := range jobs {
		for _, e := range c.engines {
			if n, ok := e.CachedFor(strconv.Itoa(j.i)); ok && n >= tokens {
				hits++
			}
		}
	}
	return float64(hits) / float64(len(jobs))
}

// TestGatewayRoutesSharedPrefixesAndSurvivesAKilledEngine sends 200
// requests that share one of six long system prompts, in chat and
// completion form (twelve token prefixes), streamed or not, through the
// gateway to three engines whose caches cannot all hold every prefix: one
// request per prefix first, one at a time, then the rest 8 at a time. It
// kills one engine after 120 of them. The same workload through a router
// that ignores the cache (load only) is the baseline.
func TestGatewayRoutesSharedPrefixesAndSurvivesAKilledEngine(t *testing.T) {
	const (
		requests    = 200
		concurrency = 8
		killAt      = 120
		prompts     = 6
		warm        = 2 * prompts
		systemWords = 10 * blockSize // ten shared blocks
	)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	jobs := sharedPrefixJobs(requests, prompts, systemWords)
	// Probe often, but give each probe and the removal time enough that a
	// healthy engine on a loaded machine is never mistaken for a dead one.
	gcfg := gateway.Config{HealthInterval: 50 * time.Millisecond, HealthTimeout: time.Second, RemoveAfter: 2 * time.Second,
		EventIdleTimeout: time.Second}

	loadOnly, err := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{BlockSize: blockSize, OverlapWeight: scheduling.Float(0)})
	require.NoError(t, err)
	base := newCluster(t, ctx, 3, router.Config{Cost: loadOnly}, gcfg, nil)
	base.waitConnected(t, ctx)
	_, baseErrs := base.run(t, ctx, jobs[:killAt], warm, concurrency, 0)
	require.NoError(t, errors.Join(baseErrs...))
	baseHits := base.foundCached(jobs[warm:killAt], systemWords)

	c := newCluster(t, ctx, 3, router.Config{}, gcfg, nil)
	c.waitConnected(t, ctx)
	answers, errs := c.run(t, ctx, jobs, warm, concurrency, killAt)
	victim := c.engines[0]

	// Every request got exactly one well-formed answer: a success, or an
	// error it was told about.
	failed := 0
	for i, a := range answers {
		require.NoError(t, errs[i], "request %d", i)
		if !a.ok {
			failed++
			assert.NotEmpty(t, a.errMsg, "request %d", i)
			t.Logf("request %d failed: status %d: %s", i, a.status, a.errMsg)
		}
	}
	// Only streams cut after their first chunk by the kill may fail.
	assert.LessOrEqual(t, failed, concurrency)

	// Shared prefixes land together: before the kill, requests go mostly
	// to an engine that holds their system prompt, far more often than
	// when routing ignores the cache.
	hits := c.foundCached(jobs[warm:killAt], systemWords)
	t.Logf("requests that found their system prompt cached: %.2f, load-only routing: %.2f", hits, baseHits)
	assert.GreaterOrEqual(t, hits, 0.6)
	assert.GreaterOrEqual(t, hits, baseHits+0.05)
	served := map[int]map[string]int{}
	for _, j := range jobs[warm:killAt] {
		if a := answers[j.i]; a.ok {
			if served[j.family] == nil {
				served[j.family] = map[string]int{}
			}
			served[j.family][a.worker]++
		}
	}
	t.Logf("engines by prefix family: %v", served)

	// Usage: asked for, it reaches the client; not asked for, the
	// gateway's own request for it does not.
	for _, j := range jobs {
		a := answers[j.i]
		if !a.ok {
			continue
		}
		_, asked := j.body["stream_options"]
		if j.body["stream"] == true && !asked {
			assert.Nil(t, a.usage, "request %d: usage chunk leaked", j.i)
		} else {
			assert.NotNil(t, a.usage, "request %d: usage missing", j.i)
		}
	}

	// The dead engine is found unhealthy and removed, with its blocks.
	deadline := time.After(10 * time.Second)
	for slices.Contains(c.router.Workers(), kvroute.WorkerKey{ID: victim.ID()}) {
		select {
		case <-deadline:
			t.Fatalf("engine %d still registered: %+v", victim.ID(), c.gw.Stats())
		case <-time.After(20 * time.Millisecond):
		}
	}
	assert.NotContains(t, c.router.Index().Workers(), kvroute.WorkerKey{ID: victim.ID()})
	for _, j := range jobs[killAt+concurrency:] {
		assert.NotEqual(t, kvroute.WorkerKey{ID: victim.ID()}.String(), answers[j.i].worker, "request %d", j.i)
	}

	// Every decision was balanced by Done (the handlers may still be
	// finishing after their clients read the answers: Close waits for
	// them); the engines' reports fed routing accuracy.
	c.srv.Close()
	st := c.router.Stats()
	assert.Equal(t, st.Decisions, st.Outcomes)
	assert.Zero(t, st.TrackedRequests)
	assert.Greater(t, st.Accuracy, 0.9)
	t.Logf("router: decisions %d, failures %d, predicted hit rate %.2f, actual %.2f, accuracy %.2f over %d",
		st.Decisions, st.Failures, st.PredictedHitRate, st.ActualHitRate, st.Accuracy, st.AccuracySamples)
	gs := c.gw.Stats()
	assert.Equal(t, uint64(requests), gs.Requests)
	assert.Equal(t, uint64(failed), gs.Failed+uint64(countMidStream(answers)))
	for _, es := range gs.Engines {
		assert.NotZero(t, es.Events.Applied, "engine %d", es.Engine.ID)
		assert.Zero(t, es.Events.Malformed, "engine %d", es.Engine.ID)
		t.Logf("engine %d: %v %+v", es.Engine.ID, es.Health, es.Events)
	}
	t.Logf("gateway: %d requests, %d retries, %d failed", gs.Requests, gs.Retries, gs.Failed)
}

// countMidStream counts the answers that were streams broken after their
// first chunk (the gateway relayed them, so it does not count them as
// its own failures).
func countMidStream(answers []answer) int {
	n := 0
	for _, a := range answers {
		if !a.ok && a.status == http.StatusOK {
			n++
		}
	}
	return n
}

func TestGatewayAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tests := []struct {
		name       string
		engines    int
		fail       int32 // 503s from each engine before it serves
		failOne    bool  // only the first engine fails
		method     string
		path       string
		body       string
		wantStatus int
		wantError  string
		wantCached bool
	}{
		{name: "completion", engines: 1, path: "/v1/completions", body: `{"model":"m","prompt":"a b c"}`, wantStatus: 200, wantCached: true},
		{name: "token prompt", engines: 1, path: "/v1/completions", body: `{"model":"m","prompt":[[1,2,3]]}`, wantStatus: 200, wantCached: true},
		{name: "chat with parts", engines: 1, path: "/v1/chat/completions",
			body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, wantStatus: 200, wantCached: true},
		{name: "retried after 503", engines: 2, fail: 1, failOne: true, path: "/v1/completions", body: `{"model":"m","prompt":"x"}`, wantStatus: 200, wantCached: true},
		{name: "last 503 relayed", engines: 1, fail: 5, path: "/v1/completions", body: `{"model":"m","prompt":"x"}`,
			wantStatus: 503, wantError: "overloaded"},
		{name: "engine 400 relayed", engines: 1, path: "/v1/completions", body: `{"model":"m","prompt":""}`,
			wantStatus: 400, wantError: "empty prompt"},
		{name: "batch", engines: 1, path: "/v1/completions", body: `{"model":"m","prompt":["a","b"]}`,
			wantStatus: 400, wantError: "batches are not routed"},
		{name: "not json", engines: 1, path: "/v1/completions", body: `{`, wantStatus: 400, wantError: "not a JSON object"},
		{name: "no messages", engines: 1, path: "/v1/chat/completions", body: `{"model":"m"}`, wantStatus: 400, wantError: "messages"},
		{name: "too large", engines: 1, path: "/v1/completions", body: `{"prompt":"` + strings.Repeat("x", 2048) + `"}`,
			wantStatus: 413, wantError: "too large"},
		{name: "wrong method", engines: 1, method: http.MethodGet, path: "/v1/completions", wantStatus: 405, wantError: "not allowed"},
		{name: "unknown path", engines: 1, path: "/v1/embeddings", body: `{}`, wantStatus: 404, wantError: "serves"},
		{name: "no engines", engines: 0, path: "/v1/completions", body: `{"model":"m","prompt":"x"}`,
			wantStatus: 503, wantError: "no eligible worker"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, ctx, tt.engines, router.Config{}, gateway.Config{MaxRequestBytes: 1024, HealthInterval: -1},
				func(i int, e *fakeEngine) {
					if i == 0 || !tt.failOne {
						e.FailNext(int(tt.fail))
					}
				})
			method := cmp.Or(tt.method, http.MethodPost)
			req, err := http.NewRequestWithContext(ctx, method, c.srv.URL+tt.path, strings.NewReader(tt.body))
			require.NoError(t, err)
			resp, err := c.client.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, tt.wantStatus, resp.StatusCode, "%s", raw)
			var got struct {
				Error *struct {
					Message string `json:"message"`
				} `json:"error"`
				Usage *testUsage `json:"usage"`
			}
			require.NoError(t, json.Unmarshal(raw, &got), "%s", raw)
			if tt.wantError != "" {
				require.NotNil(t, got.Error, "%s", raw)
				require.Contains(t, got.Error.Message, tt.wantError)
			} else {
				require.Nil(t, got.Error)
				require.Equal(t, tt.wantCached, got.Usage != nil)
				require.NotEmpty(t, resp.Header.Get(gateway.HeaderWorker))
			}
			c.srv.Close() // waits for the handler
			st := c.router.Stats()
			require.Equal(t, st.Decisions, st.Outcomes)
			require.Zero(t, st.TrackedRequests)
		})
	}
}

// TestGatewayHealthWhileDegraded: engines the router judges degraded
// still serve when no healthy one can, so the gateway stays ready while
// some are left, and says how many.
func TestGatewayHealthWhileDegraded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := newCluster(t, ctx, 1, router.Config{Health: router.HealthConfig{DegradedErrors: 1, UnhealthyErrors: 1 << 20}},
		gateway.Config{HealthInterval: 20 * time.Millisecond}, nil)
	get := func() (int, string) {
		resp, err := c.client.Get(c.srv.URL + "/health")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	status, body := get()
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `"healthy_workers":1`)
	c.engines[0].kill()
	for {
		h, _ := c.router.Health(kvroute.WorkerKey{ID: 1})
		if h == router.Degraded {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("engine still %s", h)
		case <-time.After(10 * time.Millisecond):
		}
	}
	status, body = get()
	require.Equal(t, http.StatusOK, status, body)
	require.JSONEq(t, `{"healthy_workers":0,"degraded_workers":1}`, body)
}

func TestGatewayHealth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := newCluster(t, ctx, 1, router.Config{}, gateway.Config{HealthInterval: 20 * time.Millisecond}, nil)
	get := func() int {
		resp, err := c.client.Get(c.srv.URL + "/health")
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, get())
	c.engines[0].kill()
	for get() != http.StatusServiceUnavailable {
		select {
		case <-ctx.Done():
			t.Fatal("the gateway still reports a healthy engine")
		case <-time.After(20 * time.Millisecond):
		}
	}
	for {
		h, ok := c.router.Health(kvroute.WorkerKey{ID: 1})
		require.True(t, ok, "RemoveAfter is zero: the engine stays registered")
		if h == router.Unhealthy {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("engine still %s", h)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// The gateway is a load reporter (enginemetrics.Scraper, Dynamo's load
// events report through it).
var _ enginemetrics.Reporter = (*gateway.Gateway)(nil)

// A health probe marks engines alive and keeps the load another source
// reported; engines behind one URL are probed once per round.
func TestHealthProbesKeepReportedLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var probes, inFlight, maxInFlight atomic.Int64
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			n := inFlight.Add(1)
			for m := maxInFlight.Load(); n > m && !maxInFlight.CompareAndSwap(m, n); m = maxInFlight.Load() {
			}
			time.Sleep(5 * time.Millisecond) // probes of one round would overlap
			inFlight.Add(-1)
			probes.Add(1)
		}
	}))
	defer front.Close()
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	gw, err := gateway.New(gateway.Config{Router: r, HealthInterval: 10 * time.Millisecond, HealthTimeout: 5 * time.Second, Engines: []gateway.Engine{
		{ID: 1, URL: front.URL, Preset: gateway.PresetDynamo},
		{ID: 2, URL: front.URL, Preset: gateway.PresetDynamo},
		{ID: 3, URL: front.URL, Preset: gateway.PresetDynamo},
	}})
	require.NoError(t, err)
	load := scheduling.Load{QueueDepth: 7, ActiveRequests: 3, KVUtilization: 0.5}
	require.NoError(t, gw.Heartbeat(kvroute.WorkerKey{ID: 2}, load))
	require.ErrorIs(t, gw.Heartbeat(kvroute.WorkerKey{ID: 9}, load), router.ErrUnknownWorker)

	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- gw.Run(runCtx) }()
	for probes.Load() < 5 {
		select {
		case <-ctx.Done():
			t.Fatal("no probes")
		case <-time.After(5 * time.Millisecond):
		}
	}
	stop()
	require.NoError(t, <-ran)
	for _, ws := range r.Stats().Workers {
		want := scheduling.Load{}
		if ws.Worker.ID == 2 {
			want = load
		}
		require.Equal(t, want, ws.Reported, "worker %s", ws.Worker)
		require.Equal(t, router.Healthy, ws.Health)
	}
	// Three engines, one URL: one probe per round, never three at once.
	require.Equal(t, int64(1), maxInFlight.Load())
}
