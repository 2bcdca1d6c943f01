package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/internal/dynamotest"
	"github.com/kvroute/kvroute/internal/etcdtest"
	"github.com/kvroute/kvroute/router"
)

// grepMetrics returns the lines of metrics that start with prefix.
func grepMetrics(metrics, prefix string) string {
	var out []string
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, prefix) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "; ")
}

// sumMetric returns the sum of the samples of metric name (over all its
// labels) in a Prometheus text exposition.
func sumMetric(t *testing.T, metrics, name string) float64 {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(metrics))
	require.NoError(t, err)
	var sum float64
	for _, m := range fams[name].GetMetric() {
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
	}
	return sum
}

// liveAnswer is what the live test reads of one answer.
type liveAnswer struct {
	status            int
	worker            string
	predicted, cached int
	cachedKnown       bool
	body              string
}

// chat sends one chat request and reads the answer, streamed or not.
func chat(ctx context.Context, base string, body map[string]any, header http.Header) (liveAnswer, error) {
	raw, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(raw))
	if err != nil {
		return liveAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return liveAnswer{}, err
	}
	defer resp.Body.Close()
	a := liveAnswer{status: resp.StatusCode, worker: resp.Header.Get(gateway.HeaderWorker)}
	a.predicted, _ = strconv.Atoi(resp.Header.Get(gateway.HeaderPredictedCached))
	var usage struct {
		Usage *struct {
			Details *struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	read := func(data []byte) {
		usage.Usage = nil
		if json.Unmarshal(data, &usage) == nil && usage.Usage != nil && usage.Usage.Details != nil {
			a.cached, a.cachedKnown = usage.Usage.Details.Cached, true
		}
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, err := io.ReadAll(resp.Body)
		a.body = string(b)
		read(b)
		return a, err
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && data != "[DONE]" {
			read([]byte(data))
		}
	}
	return a, sc.Err()
}

// The gateway in Dynamo mode in front of a real Dynamo deployment: two
// mocker workers and Dynamo's frontend in direct routing mode. The
// gateway discovers the workers from the store (file or etcd), indexes their KV
// events from Dynamo's event plane, tokenizes with the model directory and
// names the chosen worker in the header the frontend routes on; a shared
// prompt then lands on the worker that caches it, which reports the cached
// tokens the router predicted. A gateway started later restores the
// workers' caches from their local indexers. A worker the frontend does not know is
// refused and the request fails over, and so are requests to a worker
// killed outright: no request is lost.
func TestDynamoLive(t *testing.T) {
	for _, backend := range []string{"file", "etcd"} {
		t.Run(backend, func(t *testing.T) { testDynamoLive(t, backend) })
	}
}

func testDynamoLive(t *testing.T, backend string) {
	dynamotest.Python(t) // skip early when Dynamo is missing
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	model := filepath.Join(dir, "model")
	dynamotest.WriteModel(t, model)
	store, storeArg := filepath.Join(dir, "kv"), "file:"+filepath.Join(dir, "kv")
	if backend == "etcd" {
		_, store = etcdtest.Start(t)
		storeArg = "etcd:" + store
	}
	env, backendFlag := []string{"DYN_FILE_KV=" + store}, []string{"--discovery-backend", "file"}
	if backend == "etcd" {
		env, backendFlag = []string{"ETCD_ENDPOINTS=" + store}, []string{"--discovery-backend", "etcd"}
	}
	var procs []*dynamotest.Process
	for range 2 {
		procs = append(procs, dynamotest.StartEnv(t, env, "dynamo.mocker", append(backendFlag, "--model-path", model, "--model-name", "tiny",
			"--block-size", "16", "--num-gpu-blocks-override", "800",
			"--request-plane", "tcp", "--event-plane", "zmq", "--speedup-ratio", "1")...))
	}
	port := dynamotest.FreePort(t)
	front := fmt.Sprintf("http://127.0.0.1:%d", port)
	procs = append(procs, dynamotest.StartEnv(t, env, "dynamo.frontend", append(backendFlag, "--http-host", "127.0.0.1", "--http-port", strconv.Itoa(port),
		"--request-plane", "tcp", "--event-plane", "zmq", "--router-mode", "direct")...))
	logs := func() string {
		var b strings.Builder
		for _, p := range procs {
			fmt.Fprintf(&b, "--- %s\n%s\n", p.Module, p.Tail())
		}
		return b.String()
	}
	var ids []uint64
	for {
		ids, _ = dynamotest.Instances(ctx, front)
		if len(ids) == 2 && dynamotest.Serves(ctx, front, "tiny") {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the frontend does not see two workers (%v):\n%s", ids, logs())
		case <-time.After(200 * time.Millisecond):
		}
	}

	// startGateway runs the gateway in Dynamo mode until the test ends and
	// returns its URL once it routes to both workers.
	startGateway := func() string {
		ready := make(chan net.Addr, 1)
		gwCtx, stopGateway := context.WithCancel(ctx)
		ran := make(chan error, 1)
		go func() {
			ran <- run(gwCtx, []string{"-listen", "127.0.0.1:0", "-block-size", "16", "-model-dir", model, "-dynamo-store", storeArg,
				"-dynamo-frontend", front, "-dynamo-model", "tiny", "-health-interval", "500ms"}, io.Discard, ready)
		}()
		t.Cleanup(func() {
			stopGateway()
			require.NoError(t, <-ran)
		})
		var gw string
		select {
		case addr := <-ready:
			gw = "http://" + addr.String()
		case err := <-ran:
			t.Fatalf("gateway: %v", err)
		}
		for {
			resp, err := http.Get(gw + "/health")
			require.NoError(t, err)
			var h struct {
				Healthy int `json:"healthy_workers"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&h)
			resp.Body.Close()
			if h.Healthy == 2 {
				return gw
			}
			select {
			case <-ctx.Done():
				t.Fatalf("the gateway did not discover two workers:\n%s", logs())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	gw := startGateway()

	system := "You are a meticulous assistant for a weather service. Answer every question about rain, wind and " +
		"temperature with the numbers first, then one sentence of explanation, and never more than three sentences."
	workers := map[string]int{}
	for i := range 8 {
		body := map[string]any{"model": "tiny", "max_tokens": 4, "stream": i%2 == 1, "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": fmt.Sprintf("Will it rain on day %d?", i)}}}
		if i%2 == 1 {
			body["stream_options"] = map[string]bool{"include_usage": true}
		}
		a, err := chat(ctx, gw, body, nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, a.status, "request %d: %s\n%s", i, a.body, logs())
		require.True(t, a.cachedKnown, "request %d: Dynamo reports usage.prompt_tokens_details.cached_tokens", i)
		workers[a.worker]++
		t.Logf("request %d (stream %v) on %s: predicted %d cached tokens, Dynamo reported %d", i, i%2 == 1, a.worker, a.predicted, a.cached)
		if i > 0 {
			require.Positive(t, a.predicted, "request %d: the router predicted the shared prompt's blocks", i)
			require.Equal(t, a.predicted, a.cached, "request %d on %s: predicted and reported cached tokens agree", i, a.worker)
		}
		time.Sleep(200 * time.Millisecond) // the request's KV events reach the index
	}
	require.Len(t, workers, 1, "one shared prompt, one worker: %v", workers)
	// The gateway sent the prompts' token ids, so the frontend did not
	// tokenize them again (it warns when a request names a worker but
	// brings no tokens, as the pings below do).
	const noTokens = "backend_instance_id provided but no token_data"
	frontend := procs[len(procs)-1]
	require.NotContains(t, frontend.Log(), noTokens, "the frontend took the gateway's token ids")
	var served string
	for w := range workers {
		served = w
	}

	// A gateway started now restores the workers' caches from their
	// local indexers: its first request already finds the shared prompt.
	late := startGateway()
	body := map[string]any{"model": "tiny", "max_tokens": 4, "messages": []map[string]string{
		{"role": "system", "content": system}, {"role": "user", "content": "And on the day after?"}}}
	// A worker's cache is dumped when the gateway first hears from it:
	// wake both with a request of their own (straight to the frontend),
	// then wait until the gateway has restored both from their dumps. A
	// request routed before they arrive would be routed blind and cache
	// the prompt elsewhere.
	for _, id := range ids {
		ping := map[string]any{"model": "tiny", "max_tokens": 1, "messages": []map[string]string{{"role": "user", "content": fmt.Sprint("ping ", id)}}}
		a, err := chat(ctx, front, ping, http.Header{gateway.HeaderDynamoWorker: {strconv.FormatUint(id, 10)}})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, a.status, a.body)
	}
	require.Contains(t, frontend.Log(), noTokens, "a request without token ids makes the frontend tokenize")
	woken := time.Now()
	for restored := 0.0; restored < 2; {
		resp, err := http.Get(late + "/metrics")
		require.NoError(t, err)
		metrics, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		restored = sumMetric(t, string(metrics), "kvroute_dynamo_events_workers_restored_total")
		if time.Since(woken) > time.Minute {
			t.Fatalf("the late gateway restored %v of 2 workers in a minute: %s\n%s", restored,
				grepMetrics(string(metrics), "kvroute_dynamo_events_"), logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("late gateway: both workers restored %v after the pings", time.Since(woken).Round(time.Millisecond))
	a, err := chat(ctx, late, body, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, a.status, a.body)
	t.Logf("late gateway: %s predicted %d, Dynamo reported %d", a.worker, a.predicted, a.cached)
	require.Positive(t, a.predicted, "the late gateway restored the workers' caches")
	require.Equal(t, served, a.worker, "the late gateway knows where the prompt is cached")
	require.Equal(t, a.cached, a.predicted)
	for w := range workers {
		id, _, _ := strings.Cut(w, "/")
		require.Contains(t, []string{strconv.FormatUint(ids[0], 10), strconv.FormatUint(ids[1], 10)}, id)
	}

	// Prometheus metrics on the same address: predicted and reported.
	resp, err := http.Get(gw + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"kvroute_router_predicted_cached_tokens_total", "kvroute_router_actual_cached_tokens_total", "kvroute_gateway_requests_total 8"} {
		require.Contains(t, string(metrics), name)
	}

	// The frontend refuses a worker it does not know; the gateway moves
	// the request to another.
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	require.NoError(t, err)
	tok, err := gateway.LoadModelTokenizer(model)
	require.NoError(t, err)
	static, err := gateway.New(gateway.Config{Router: r, Tokenizer: tok, HealthInterval: -1, Engines: []gateway.Engine{
		{ID: kvroute.WorkerID(ids[0]), URL: front, Preset: gateway.PresetDynamo},
		{ID: 12345, URL: front, Preset: gateway.PresetDynamo}, // gone
	}})
	require.NoError(t, err)
	srv := &http.Server{Handler: static}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	for i := 0; static.Stats().Retries == 0; i++ {
		require.Less(t, i, 30, "the router never chose the unknown worker")
		// Prompts that share no block: the router has no reason to
		// prefer the known worker.
		body := map[string]any{"model": "tiny", "max_tokens": 2, "messages": []map[string]string{{"role": "user", "content": fmt.Sprint(i, " hello")}}}
		// A client's own routing header never reaches the frontend.
		a, err := chat(ctx, "http://"+ln.Addr().String(), body, http.Header{"X-Dynamo-Worker-Instance-Id": {"12345"}})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, a.status, a.body)
		require.Equal(t, fmt.Sprint(ids[0], "/0"), a.worker)
	}
	require.Zero(t, static.Stats().Failed)

	// A worker killed outright: until the store forgets it, requests the
	// router still sends it fail over to the other; none is lost.
	procs[0].Stop(syscall.SIGKILL)
	for i := range 10 {
		body := map[string]any{"model": "tiny", "max_tokens": 2, "stream": i%2 == 0,
			"messages": []map[string]string{{"role": "user", "content": fmt.Sprint(i, " after the crash")}}}
		a, err := chat(ctx, gw, body, nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, a.status, "request %d after the kill: %s\n%s", i, a.body, logs())
	}
	resp, err = http.Get(gw + "/metrics")
	require.NoError(t, err)
	metrics, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("after the kill: %s", grepMetrics(string(metrics), "kvroute_gateway_"))
}
