// Package fakeengine is an OpenAI-compatible inference engine for tests:
// a real prefix cache (blocks named by Dynamo's chained hash, evicted
// least recently used) that answers completions and chat completions with
// usage.prompt_tokens_details.cached_tokens, streams server-sent events,
// publishes its cache changes as vLLM KV events over ZMQ (with a replay
// socket) and serves Prometheus metrics under vLLM's names. It tokenizes
// with Words, so a router that tokenizes with Words agrees with it.
package fakeengine

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/words"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/openai"
)

// Topic is the ZMQ topic the engine publishes on.
const Topic = "kv-events"

// Config describes an Engine.
type Config struct {
	ID        kvroute.WorkerID
	BlockSize int           // zero means 16
	Capacity  int           // cache size in blocks; zero means 1024
	Chunks    int           // streamed chunks per response; zero means 4
	Delay     time.Duration // between streamed chunks
	// Adapters are the model names served as LoRA adapters: their blocks
	// are hashed and published under the adapter's name.
	Adapters []string
	// TextOnly makes the engine's chat template drop tools, images and
	// chat_template_kwargs, as a template that disagrees with the
	// router's would.
	TextOnly bool
}

// Engine is a running fake engine on 127.0.0.1.
type Engine struct {
	cfg    Config
	hasher kvroute.Hasher
	ln     net.Listener
	srv    *http.Server
	pub    zmq4.Socket
	replay zmq4.Socket
	pubEP  string
	repEP  string

	// mu protects the cache, the event sequence and the replay buffer, so
	// that batches are published in sequence order.
	mu     sync.Mutex
	cache  map[kvroute.SeqHash]uint64 // block → last use
	tick   uint64
	seq    uint64
	buffer [][]byte // payload of batch i

	requests  atomic.Int64
	cachedBy  sync.Map // X-Request-Id → cached prompt tokens
	running   atomic.Int64
	published atomic.Int64
	fail      atomic.Int32
	failWith  atomic.Int32 // the status of the failed answers
	closed    atomic.Bool
}

// Start starts an engine.
func Start(cfg Config) (*Engine, error) {
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = 1024
	}
	if cfg.Chunks == 0 {
		cfg.Chunks = 4
	}
	h, err := kvroute.NewHasher(kvroute.HasherConfig{BlockSize: cfg.BlockSize})
	if err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, hasher: h, cache: map[kvroute.SeqHash]uint64{}}
	ctx := context.Background()
	e.pub, e.replay = zmq4.NewPub(ctx), zmq4.NewRouter(ctx)
	if err := e.pub.Listen("tcp://127.0.0.1:0"); err != nil {
		return nil, err
	}
	if err := e.replay.Listen("tcp://127.0.0.1:0"); err != nil {
		e.pub.Close()
		return nil, err
	}
	e.pubEP, e.repEP = "tcp://"+e.pub.Addr().String(), "tcp://"+e.replay.Addr().String()
	go e.serveReplay()
	if e.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		e.pub.Close()
		e.replay.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { e.complete(w, r, openai.KindCompletion) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { e.complete(w, r, openai.KindChat) })
	mux.HandleFunc("GET /metrics", e.metrics)
	mux.HandleFunc("POST /tokenize", e.tokenize)
	mux.HandleFunc("POST /v1/tokenize", e.tokenize)
	mux.HandleFunc("POST /v1/chat/completions/render", func(w http.ResponseWriter, r *http.Request) { e.render(w, r, openai.KindChat) })
	mux.HandleFunc("POST /v1/completions/render", func(w http.ResponseWriter, r *http.Request) { e.render(w, r, openai.KindCompletion) })
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = e.srv.Serve(e.ln) }()
	return e, nil
}

// Addr is the engine's HTTP "ip:port".
func (e *Engine) Addr() string { return e.ln.Addr().String() }

// URL is the engine's HTTP base URL.
func (e *Engine) URL() string { return "http://" + e.Addr() }

// Events and Replay are the engine's ZMQ PUB and replay endpoints.
func (e *Engine) Events() string { return e.pubEP }

// Replay is the engine's ZMQ replay endpoint.
func (e *Engine) Replay() string { return e.repEP }

// ID is the engine's worker id.
func (e *Engine) ID() kvroute.WorkerID { return e.cfg.ID }

// Requests is the number of completion requests received.
func (e *Engine) Requests() int64 { return e.requests.Load() }

// Published is the number of KV events published.
func (e *Engine) Published() int64 { return e.published.Load() }

// CachedFor returns the cached prompt tokens of the request that carried
// the X-Request-Id header id.
func (e *Engine) CachedFor(id string) (int, bool) {
	v, ok := e.cachedBy.Load(id)
	if !ok {
		return 0, false
	}
	return v.(int), true
}

// FailNext answers the next n completion requests with 503.
func (e *Engine) FailNext(n int) { e.FailNextWith(n, http.StatusServiceUnavailable) }

// FailNextWith answers the next n completion requests with status, an
// HTTP error status.
func (e *Engine) FailNextWith(n, status int) {
	e.failWith.Store(int32(status))
	e.fail.Store(int32(n))
}

// Close stops the engine at once.
func (e *Engine) Close() {
	if e.closed.Swap(true) {
		return
	}
	_ = e.srv.Close()
	e.pub.Close()
	e.replay.Close()
}

// serveReplay answers replay requests ([id, empty, start seq]) with every
// buffered batch from start on, then the end marker.
func (e *Engine) serveReplay() {
	for {
		m, err := e.replay.Recv()
		if err != nil {
			return
		}
		if len(m.Frames) != 3 || len(m.Frames[2]) != 8 {
			continue
		}
		id, start := m.Frames[0], binary.BigEndian.Uint64(m.Frames[2])
		e.mu.Lock()
		batches := slices.Clone(e.buffer)
		e.mu.Unlock()
		for s := start; s < uint64(len(batches)); s++ {
			_ = e.replay.Send(zmq4.NewMsgFrom(id, []byte{}, be64(s), batches[s]))
		}
		_ = e.replay.Send(zmq4.NewMsgFrom(id, []byte{}, be64(^uint64(0)), []byte{}))
	}
}

func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// admit runs a prompt through the cache: it returns the cached prefix in
// tokens and publishes the blocks stored and evicted as one vLLM batch.
// Blocks of an adapter or under a cache salt are hashed with them.
func (e *Engine) admit(tokens []uint32, model, salt string, mm []kvroute.MMObject) (int, error) {
	h, lora := e.hasher, ""
	if slices.Contains(e.cfg.Adapters, model) {
		h, lora = h.WithLoRA(model), model
	}
	if salt != "" {
		h = h.WithSalt(salt)
	}
	bs := h.BlockSize()
	seqs := h.AppendSeqHashesMM(nil, tokens, mm)
	e.mu.Lock()
	defer e.mu.Unlock()
	cached := 0
	for cached < len(seqs) {
		if _, ok := e.cache[seqs[cached]]; !ok {
			break
		}
		cached++
	}
	var events []kvevents.EngineEvent
	if cached < len(seqs) {
		stored := kvevents.EngineEvent{Type: kvevents.BlockStored, BlockSize: bs, TokenIDs: tokens[cached*bs : len(seqs)*bs],
			LoRAName: lora, CacheSalt: salt}
		if salt != "" {
			stored.Layout = kvevents.LayoutMap // the array layout carries no salt field
		}
		if len(mm) > 0 {
			stored.ExtraKeys = extraKeys(mm, cached, len(seqs), bs)
		}
		if cached > 0 {
			stored.ParentBlockHash = kvevents.UintHash(uint64(seqs[cached-1]))
		}
		for _, s := range seqs[cached:] {
			stored.BlockHashes = append(stored.BlockHashes, kvevents.UintHash(uint64(s)))
		}
		events = append(events, stored)
	}
	// Touch tail first, so that a parent is always used more recently
	// than its children and leaves are evicted first.
	for i := len(seqs) - 1; i >= 0; i-- {
		e.tick++
		e.cache[seqs[i]] = e.tick
	}
	if len(e.cache) > e.cfg.Capacity {
		victims := make([]kvroute.SeqHash, 0, len(e.cache))
		for s := range e.cache {
			victims = append(victims, s)
		}
		slices.SortFunc(victims, func(a, b kvroute.SeqHash) int { return cmp.Compare(e.cache[a], e.cache[b]) })
		removed := kvevents.EngineEvent{Type: kvevents.BlockRemoved}
		for _, s := range victims[:len(e.cache)-e.cfg.Capacity] {
			delete(e.cache, s)
			removed.BlockHashes = append(removed.BlockHashes, kvevents.UintHash(uint64(s)))
		}
		events = append(events, removed)
	}
	if len(events) > 0 {
		if err := e.publish(events); err != nil {
			return 0, err
		}
	}
	return cached * bs, nil
}

// extraKeys encodes vLLM's extra_keys for blocks first to end-1: for each,
// nil or the [identifier, offset] pairs of the multimodal items whose
// placeholder tokens it overlaps. The identifier is a 64-digit hex digest
// whose first 16 digits are the item's hash.
func extraKeys(mm []kvroute.MMObject, first, end, bs int) []byte {
	b := msgp.AppendArrayHeader(nil, uint32(end-first))
	for blk := first; blk < end; blk++ {
		var items []kvroute.MMObject
		for _, o := range mm {
			if o.Offset < (blk+1)*bs && o.Offset+o.Length > blk*bs {
				items = append(items, o)
			}
		}
		if len(items) == 0 {
			b = msgp.AppendNil(b)
			continue
		}
		b = msgp.AppendArrayHeader(b, uint32(len(items)))
		for _, o := range items {
			b = msgp.AppendArrayHeader(b, 2)
			b = msgp.AppendString(b, fmt.Sprintf("%016x%048x", o.Hash, 0))
			b = msgp.AppendInt(b, o.Offset)
		}
	}
	return b
}

// Ping publishes a batch without events, so that a subscriber that
// connected after the last batch learns the sequence it is at.
func (e *Engine) Ping() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.publish(nil)
}

// publish sends one batch of events; e.mu is held.
func (e *Engine) publish(events []kvevents.EngineEvent) error {
	payload, err := kvevents.AppendBatch(nil, &kvevents.Batch{Timestamp: float64(time.Now().UnixNano()) / 1e9,
		Events: events, RankSlot: true})
	if err != nil {
		return err
	}
	e.buffer = append(e.buffer, payload)
	// A PUB socket drops messages nobody subscribes to yet; the
	// subscriber replays them.
	_ = e.pub.Send(zmq4.NewMsgFrom([]byte(Topic), be64(e.seq), payload))
	e.published.Add(int64(len(events)))
	e.seq++
	return nil
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "code": status}})
	_, _ = w.Write(b)
}

func (e *Engine) complete(w http.ResponseWriter, r *http.Request, kind openai.Kind) {
	e.requests.Add(1)
	e.running.Add(1)
	defer e.running.Add(-1)
	if e.fail.Add(-1) >= 0 {
		msg, status := "overloaded", int(e.failWith.Load())
		if status != http.StatusServiceUnavailable {
			msg = http.StatusText(status)
		}
		writeError(w, status, msg)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	req, err := openai.ParseRequest(body, kind)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	tokens, mm, err := e.template(req)
	if err == nil && len(tokens) == 0 {
		err = fmt.Errorf("empty prompt")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	cached, err := e.admit(tokens, req.Model, req.CacheSalt, mm)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if id := r.Header.Get("X-Request-Id"); id != "" {
		e.cachedBy.Store(id, cached)
	}
	chunks := e.cfg.Chunks
	usage := map[string]any{
		"prompt_tokens": len(tokens), "completion_tokens": chunks, "total_tokens": len(tokens) + chunks,
		"prompt_tokens_details": map[string]int{"cached_tokens": cached},
	}
	object, choice := "text_completion", func(i int) map[string]any { return map[string]any{"index": 0, "text": fmt.Sprintf("t%d ", i)} }
	if kind == openai.KindChat {
		object = "chat.completion"
		choice = func(i int) map[string]any {
			return map[string]any{"index": 0, "delta": map[string]string{"content": fmt.Sprintf("t%d ", i)}}
		}
	}
	w.Header().Set("X-Engine-Id", fmt.Sprint(e.cfg.ID))
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "cmpl-1", "object": object, "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "text": "done", "message": map[string]string{"role": "assistant", "content": "done"}, "finish_reason": "length"}},
			"usage":   usage})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	send := func(v any) bool {
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	for i := range chunks {
		if !send(map[string]any{"id": "cmpl-1", "object": object + ".chunk", "choices": []any{choice(i)}}) {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(e.cfg.Delay):
		}
	}
	if req.IncludeUsage {
		if !send(map[string]any{"id": "cmpl-1", "object": object + ".chunk", "choices": []any{}, "usage": usage}) {
			return
		}
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
}

// metrics serves the engine's load under vLLM's metric names.
func (e *Engine) metrics(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	used := len(e.cache)
	e.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} %d\n", e.running.Load())
	fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n")
	fmt.Fprintf(w, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} %g\n", float64(used)/float64(e.cfg.Capacity))
	fmt.Fprintf(w, "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"%d\",num_gpu_blocks=\"%d\"} 1\n", e.cfg.BlockSize, e.cfg.Capacity)
}

// template renders a request with the engine's template: Render, or
// Words when TextOnly.
func (e *Engine) template(req *openai.Request) ([]uint32, []kvroute.MMObject, error) {
	if e.cfg.TextOnly {
		ids, err := Words(context.Background(), req, nil)
		return ids, nil, err
	}
	return Render(req)
}

// rendered reads a request of the given kind (zero: chat when it has
// messages) and renders it with the engine's template; it answers 400 and
// returns false when it cannot.
func (e *Engine) rendered(w http.ResponseWriter, r *http.Request, kind openai.Kind) ([]uint32, []kvroute.MMObject, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return nil, nil, false
	}
	if kind == 0 {
		var probe struct {
			Messages json.RawMessage `json:"messages"`
		}
		_ = json.Unmarshal(body, &probe)
		kind = openai.KindCompletion
		if probe.Messages != nil {
			kind = openai.KindChat
		}
	}
	req, err := openai.ParseRequest(body, kind)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return nil, nil, false
	}
	ids, mm, err := e.template(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return nil, nil, false
	}
	if ids == nil {
		ids = []uint32{} // an empty list, not null
	}
	return ids, mm, true
}

// tokenize is vLLM's /tokenize (and SGLang's /v1/tokenize): a prompt, or
// messages with tools and chat_template_kwargs.
func (e *Engine) tokenize(w http.ResponseWriter, r *http.Request) {
	ids, _, ok := e.rendered(w, r, 0)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"tokens": ids, "count": len(ids), "max_model_len": 1 << 20})
}

// render is vLLM's /v1/chat/completions/render and /v1/completions/render.
func (e *Engine) render(w http.ResponseWriter, r *http.Request, kind openai.Kind) {
	ids, mm, ok := e.rendered(w, r, kind)
	if !ok {
		return
	}
	var hashes []string
	var places []map[string]int
	for _, o := range mm {
		hashes = append(hashes, fmt.Sprintf("%016x%048x", o.Hash, 0))
		places = append(places, map[string]int{"offset": o.Offset, "length": o.Length})
	}
	out := map[string]any{"token_ids": ids}
	if len(mm) > 0 {
		out["features"] = map[string]any{"mm_hashes": map[string]any{"image": hashes}, "mm_placeholders": map[string]any{"image": places}}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// ImageTokens is the number of placeholder tokens of an image in Render.
const ImageTokens = 4

// Render is the engine's chat template, deterministic and for tests only:
// Words, with the tools first (the token of "<|tools|>" and the words of
// the tools' JSON), each image part as ImageTokens tokens of "<|image|>"
// (a multimodal item hashed from its URL), and the token of
// "<|think|>" after the generation prompt when chat_template_kwargs has
// "enable_thinking": true.
func Render(req *openai.Request) ([]uint32, []kvroute.MMObject, error) {
	if req.Kind == openai.KindCompletion {
		ids, err := Words(context.Background(), req, nil)
		return ids, nil, err
	}
	var ids []uint32
	var mm []kvroute.MMObject
	if len(req.Tools) > 0 {
		ids = append(ids, words.Role("tools"))
		ids = words.Append(ids, string(req.Tools))
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(req.Messages, &msgs); err != nil {
		return nil, nil, err
	}
	for _, m := range msgs {
		ids = append(ids, words.Role(m.Role))
		var text string
		if json.Unmarshal(m.Content, &text) == nil {
			ids = words.Append(ids, text)
			continue
		}
		var parts []struct {
			Type     string `json:"type"`
			Text     string `json:"text"`
			ImageURL struct {
				URL string `json:"url"`
			} `json:"image_url"`
		}
		_ = json.Unmarshal(m.Content, &parts)
		for _, p := range parts {
			switch p.Type {
			case "text":
				ids = words.Append(ids, p.Text)
			case "image_url":
				h, _ := kvroute.MMIdentifierHash(p.ImageURL.URL)
				mm = append(mm, kvroute.MMObject{Hash: h, Offset: len(ids), Length: ImageTokens})
				for range ImageTokens {
					ids = append(ids, words.Role("image"))
				}
			}
		}
	}
	ids = append(ids, words.Role("assistant"))
	var kw struct {
		Think bool `json:"enable_thinking"`
	}
	if req.ChatTemplateKwargs != nil && json.Unmarshal(req.ChatTemplateKwargs, &kw) == nil && kw.Think {
		ids = append(ids, words.Role("think"))
	}
	return ids, mm, nil
}

// Words is the engine's tokenizer, deterministic and for tests only: one
// token per run of non-space characters, its id the run's 32-bit FNV-1a
// hash. A chat becomes, per message, the token of "<|role|>" and the
// content's tokens, then the token of "<|assistant|>". Completion token
// ids are taken as they are.
func Words(_ context.Context, req *openai.Request, dst []uint32) ([]uint32, error) {
	if req.Kind == openai.KindCompletion {
		if req.HasTokens {
			return append(dst, req.PromptTokens...), nil
		}
		return words.Append(dst, req.Prompt), nil
	}
	msgs, err := req.TextMessages()
	if err != nil {
		return dst, err
	}
	for _, m := range msgs {
		dst = append(dst, words.Role(m.Role))
		dst = words.Append(dst, m.Content)
	}
	return append(dst, words.Role("assistant")), nil
}
