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
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/router"
)

// dynamoPython returns the interpreter and PYTHONPATH that run Dynamo's
// mocker and frontend (KVROUTE_DYNAMO_PYTHON, default python3; PYTHONPATH
// joins KVROUTE_DYNAMO_MOCKER_PYTHONPATH and KVROUTE_DYNAMO_PYTHONPATH,
// set by .ci/setup-dynamo-mocker.sh and .ci/setup-dynamo.sh), or skips the
// test naming what is missing (fails it under KVROUTE_EXTERNAL_TESTS=1).
func dynamoPython(t *testing.T) (string, string) {
	t.Helper()
	py := os.Getenv("KVROUTE_DYNAMO_PYTHON")
	if py == "" {
		py = "python3"
	}
	var dirs []string
	for _, v := range []string{"KVROUTE_DYNAMO_MOCKER_PYTHONPATH", "KVROUTE_DYNAMO_PYTHONPATH"} {
		if d := os.Getenv(v); d != "" {
			dirs = append(dirs, d)
		}
	}
	path := strings.Join(dirs, string(os.PathListSeparator))
	var missing string
	if _, err := exec.LookPath(py); err != nil {
		missing = py
	} else {
		cmd := exec.Command(py, "-c", "import dynamo.mocker.main, dynamo.frontend.main")
		cmd.Env = append(os.Environ(), "PYTHONPATH="+path)
		if out, err := cmd.CombinedOutput(); err != nil {
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			missing = fmt.Sprintf("Dynamo's mocker and frontend (ai-dynamo and ai-dynamo-runtime 1.6.1) for %s: %s", py, lines[len(lines)-1])
		}
	}
	if missing == "" {
		return py, path
	}
	if os.Getenv("KVROUTE_EXTERNAL_TESTS") == "1" {
		t.Fatalf("missing %s (KVROUTE_EXTERNAL_TESTS=1)", missing)
	}
	t.Skipf("missing %s; source .ci/setup-dynamo.sh and .ci/setup-dynamo-mocker.sh with CI=true, or set KVROUTE_DYNAMO_PYTHON to a Python with ai-dynamo", missing)
	return "", ""
}

// writeTinyModel writes a tokenizer-only model directory that Dynamo's
// mocker and frontend serve: a byte-level BPE without merges (one token
// per byte), Llama-3-like special tokens and chat template, and reserved
// tokens up to a vocabulary of 4096, so that the ids the mocker emits
// (around 1,000 to 2,000) decode.
func writeTinyModel(t *testing.T, dir string) {
	t.Helper()
	// GPT-2's byte-to-character table.
	var chars []rune
	var rest []int
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			chars = append(chars, rune(b))
		} else {
			rest = append(rest, b)
		}
	}
	for i := range rest {
		chars = append(chars, rune(256+i))
	}
	vocab := map[string]int{}
	for i, c := range chars {
		vocab[string(c)] = i
	}
	specials := []string{"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
	for i := 0; len(vocab)+len(specials) < 4096; i++ {
		specials = append(specials, fmt.Sprintf("<|reserved_%d|>", i))
	}
	var added []map[string]any
	for _, s := range specials {
		vocab[s] = len(vocab)
		added = append(added, map[string]any{"id": vocab[s], "content": s, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true})
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
	files := map[string]any{
		"tokenizer.json": map[string]any{"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added,
			"normalizer": nil, "pre_tokenizer": byteLevel, "post_processor": byteLevel, "decoder": byteLevel,
			"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
				"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
				"vocab": vocab, "merges": []string{}}},
		"tokenizer_config.json": map[string]any{"bos_token": specials[0], "eos_token": specials[4],
			"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072,
			"chat_template": "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n" +
				"{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"},
		"config.json": map[string]any{"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "vocab_size": 4096,
			"max_position_embeddings": 131072, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
			"num_hidden_layers": 2, "intermediate_size": 128, "bos_token_id": 0, "eos_token_id": 4, "torch_dtype": "bfloat16"},
		"generation_config.json": map[string]any{"bos_token_id": 0, "eos_token_id": 4},
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for name, v := range files {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
	}
}

// dynamoProcess is a running Dynamo process (mocker or frontend) in its
// own process group, killed when the test ends.
type dynamoProcess struct {
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
}

// startDynamo runs python -m module args with every address on loopback
// and the file store at store.
func startDynamo(t *testing.T, store string, module string, args ...string) *dynamoProcess {
	t.Helper()
	py, path := dynamoPython(t)
	log := filepath.Join(t.TempDir(), strings.ReplaceAll(module, ".", "-")+".log")
	f, err := os.Create(log)
	require.NoError(t, err)
	cmd := exec.Command(py, append([]string{"-m", module}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+path, "DYN_FILE_KV="+store, "DYN_TCP_RPC_HOST=127.0.0.1",
		"DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1", "DYN_EVENT_PLANE_HOST=127.0.0.1", "DYN_SYSTEM_HOST=127.0.0.1", "DYN_LOG=info")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	p := &dynamoProcess{cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	})
	return p
}

// tail returns the end of the process's log, for failure messages.
func (p *dynamoProcess) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// freePort returns a loopback port nobody listens on right now.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// frontendInstances returns the instance ids of the generate endpoints
// Dynamo's frontend sees (its /health).
func frontendInstances(ctx context.Context, base string) ([]uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var h struct {
		Instances []struct {
			Endpoint   string `json:"endpoint"`
			InstanceID uint64 `json:"instance_id"`
		} `json:"instances"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return nil, err
	}
	var ids []uint64
	for _, in := range h.Instances {
		if in.Endpoint == "generate" {
			ids = append(ids, in.InstanceID)
		}
	}
	return ids, nil
}

// frontendServes reports whether Dynamo's frontend lists model.
func frontendServes(ctx context.Context, base, model string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&list) != nil {
		return false
	}
	for _, m := range list.Data {
		if m.ID == model {
			return true
		}
	}
	return false
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
// gateway discovers the workers from the file store, indexes their KV
// events from Dynamo's event plane, tokenizes with the model directory and
// names the chosen worker in the header the frontend routes on; a shared
// prompt then lands on the worker that caches it, which reports the cached
// tokens the router predicted. A worker the frontend does not know is
// refused and the request fails over.
func TestDynamoLive(t *testing.T) {
	dynamoPython(t) // skip early when Dynamo is missing
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	model, store := filepath.Join(dir, "model"), filepath.Join(dir, "kv")
	writeTinyModel(t, model)
	var procs []*dynamoProcess
	for range 2 {
		procs = append(procs, startDynamo(t, store, "dynamo.mocker", "--model-path", model, "--model-name", "tiny",
			"--block-size", "16", "--num-gpu-blocks-override", "800", "--discovery-backend", "file",
			"--request-plane", "tcp", "--event-plane", "zmq", "--speedup-ratio", "1"))
	}
	port := freePort(t)
	front := fmt.Sprintf("http://127.0.0.1:%d", port)
	procs = append(procs, startDynamo(t, store, "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", strconv.Itoa(port), "--discovery-backend", "file",
		"--request-plane", "tcp", "--event-plane", "zmq", "--router-mode", "direct"))
	logs := func() string {
		var b strings.Builder
		for _, p := range procs {
			fmt.Fprintf(&b, "--- %s\n%s\n", p.cmd.Args[2], p.tail())
		}
		return b.String()
	}
	var ids []uint64
	for {
		ids, _ = frontendInstances(ctx, front)
		if len(ids) == 2 && frontendServes(ctx, front, "tiny") {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the frontend does not see two workers (%v):\n%s", ids, logs())
		case <-time.After(200 * time.Millisecond):
		}
	}

	ready := make(chan net.Addr, 1)
	gwCtx, stopGateway := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() {
		ran <- run(gwCtx, []string{"-listen", "127.0.0.1:0", "-block-size", "16", "-model-dir", model, "-dynamo-store", "file:" + store,
			"-dynamo-frontend", front, "-dynamo-model", "tiny", "-health-interval", "500ms"}, io.Discard, ready)
	}()
	defer func() {
		stopGateway()
		require.NoError(t, <-ran)
	}()
	var gw string
	select {
	case addr := <-ready:
		gw = "http://" + addr.String()
	case err := <-ran:
		t.Fatalf("gateway: %v", err)
	}
	// The gateway routes once it has discovered both workers.
	for {
		resp, err := http.Get(gw + "/health")
		require.NoError(t, err)
		var h struct {
			Healthy int `json:"healthy_workers"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if h.Healthy == 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the gateway did not discover two workers:\n%s", logs())
		case <-time.After(100 * time.Millisecond):
		}
	}

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
		if i > 0 {
			require.Positive(t, a.predicted, "request %d: the router predicted the shared prompt's blocks", i)
			require.Equal(t, a.predicted, a.cached, "request %d on %s: predicted and reported cached tokens agree", i, a.worker)
		}
		time.Sleep(200 * time.Millisecond) // the request's KV events reach the index
	}
	require.Len(t, workers, 1, "one shared prompt, one worker: %v", workers)
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
}
