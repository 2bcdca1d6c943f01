package gateway_test

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/kvevents"
)

// fakeEngine is an OpenAI-compatible engine on loopback with a real prefix
// cache: blocks named by their chained hash, evicted least recently used
// (leaves first, as vLLM frees a sequence's blocks tail first), reported
// in usage.prompt_tokens_details.cached_tokens and published as vLLM KV
// events on a ZMQ PUB socket, with a replay ROUTER socket over every batch
// it has published.
type fakeEngine struct {
	t        testing.TB
	id       kvroute.WorkerID
	hasher   kvroute.Hasher
	capacity int           // cache size in blocks
	chunks   int           // streamed chunks per response
	delay    time.Duration // between streamed chunks

	srv      *httptest.Server
	pub      zmq4.Socket
	replay   zmq4.Socket
	pubEP    string
	replayEP string

	// mu protects the cache, the event sequence and the replay buffer, so
	// that batches are published in sequence order.
	mu     sync.Mutex
	cache  map[kvroute.SeqHash]uint64 // block → last use
	tick   uint64
	seq    uint64
	buffer [][]byte // payload of batch i

	requests  atomic.Int64 // completion requests received
	cachedBy  sync.Map     // X-Request-Id → cached prompt tokens
	published atomic.Int64 // events published
	fail      atomic.Int32 // answer this many more requests with 503
	killed    atomic.Bool
}

func newFakeEngine(t testing.TB, id kvroute.WorkerID, blockSize, capacity, chunks int, delay time.Duration) *fakeEngine {
	e := &fakeEngine{
		t: t, id: id, capacity: capacity, chunks: chunks, delay: delay,
		hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: blockSize}),
		cache:  map[kvroute.SeqHash]uint64{},
	}
	ctx := context.Background()
	e.pub, e.replay = zmq4.NewPub(ctx), zmq4.NewRouter(ctx)
	require.NoError(t, e.pub.Listen("tcp://127.0.0.1:0"))
	require.NoError(t, e.replay.Listen("tcp://127.0.0.1:0"))
	e.pubEP = "tcp://" + e.pub.Addr().String()
	e.replayEP = "tcp://" + e.replay.Addr().String()
	go e.serveReplay()

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { e.complete(w, r, false) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { e.complete(w, r, true) })
	mux.HandleFunc("POST /tokenize", e.tokenize)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {})
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.kill)
	return e
}

// engine describes the fake to the gateway.
func (e *fakeEngine) engine() gateway.Engine {
	return gateway.Engine{ID: e.id, URL: e.srv.URL, Events: e.pubEP, Replay: e.replayEP, Topic: "kv-events"}
}

// kill stops the engine at once: open connections are cut, the sockets
// closed.
func (e *fakeEngine) kill() {
	if e.killed.Swap(true) {
		return
	}
	e.srv.CloseClientConnections()
	e.srv.Close()
	e.pub.Close()
	e.replay.Close()
}

// serveReplay answers replay requests ([id, empty, start seq]) with every
// buffered batch from start on, then the end marker.
func (e *fakeEngine) serveReplay() {
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
func (e *fakeEngine) admit(tokens []uint32) int {
	bs := e.hasher.BlockSize()
	seqs := e.hasher.AppendSeqHashes(nil, tokens)
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
		stored := kvevents.EngineEvent{Type: kvevents.BlockStored, BlockSize: bs, TokenIDs: tokens[cached*bs : len(seqs)*bs]}
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
	if len(e.cache) > e.capacity {
		victims := make([]kvroute.SeqHash, 0, len(e.cache))
		for s := range e.cache {
			victims = append(victims, s)
		}
		slices.SortFunc(victims, func(a, b kvroute.SeqHash) int { return cmp.Compare(e.cache[a], e.cache[b]) })
		removed := kvevents.EngineEvent{Type: kvevents.BlockRemoved}
		for _, s := range victims[:len(e.cache)-e.capacity] {
			delete(e.cache, s)
			removed.BlockHashes = append(removed.BlockHashes, kvevents.UintHash(uint64(s)))
		}
		events = append(events, removed)
	}
	if len(events) > 0 {
		payload, err := kvevents.AppendBatch(nil, &kvevents.Batch{Timestamp: float64(time.Now().UnixNano()) / 1e9,
			Events: events, RankSlot: true})
		require.NoError(e.t, err)
		e.buffer = append(e.buffer, payload)
		// A PUB socket drops messages nobody subscribes to yet; the
		// subscriber replays them.
		_ = e.pub.Send(zmq4.NewMsgFrom([]byte("kv-events"), be64(e.seq), payload))
		e.published.Add(int64(len(events)))
		e.seq++
	}
	return cached * bs
}

// completionRequest is what the fake reads of a request.
type completionRequest struct {
	Model         string            `json:"model"`
	Prompt        json.RawMessage   `json:"prompt"`
	Messages      []gateway.Message `json:"messages"`
	Stream        bool              `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func (e *fakeEngine) prompt(req *completionRequest, chat bool) (gateway.Prompt, error) {
	p := gateway.Prompt{Model: req.Model, Messages: req.Messages}
	if chat {
		return p, nil
	}
	var batch [][]uint32
	switch {
	case json.Unmarshal(req.Prompt, &p.Text) == nil, json.Unmarshal(req.Prompt, &p.Tokens) == nil:
	case json.Unmarshal(req.Prompt, &batch) == nil && len(batch) == 1:
		p.Tokens = batch[0]
	default:
		return p, fmt.Errorf("prompt %s is not supported", req.Prompt)
	}
	return p, nil
}

func (e *fakeEngine) complete(w http.ResponseWriter, r *http.Request, chat bool) {
	e.requests.Add(1)
	if e.fail.Add(-1) >= 0 {
		http.Error(w, `{"error":{"message":"overloaded","type":"server_error","code":503}}`, http.StatusServiceUnavailable)
		return
	}
	var req completionRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, `{"error":{"message":"bad json","type":"invalid_request_error","code":400}}`, http.StatusBadRequest)
		return
	}
	p, err := e.prompt(&req, chat)
	if err == nil && len(p.Messages) == 0 && p.Text == "" && len(p.Tokens) == 0 {
		err = fmt.Errorf("empty prompt")
	}
	if err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = fmt.Fprintf(w, `{"error":{"message":%q,"type":"invalid_request_error","code":400}}`, err)
		return
	}
	tokens, _ := gateway.WordTokenizer{}.Tokenize(r.Context(), &p, nil)
	cached := e.admit(tokens)
	if id := r.Header.Get("X-Request-Id"); id != "" {
		e.cachedBy.Store(id, cached)
	}
	usage := map[string]any{
		"prompt_tokens": len(tokens), "completion_tokens": e.chunks, "total_tokens": len(tokens) + e.chunks,
		"prompt_tokens_details": map[string]int{"cached_tokens": cached},
	}
	object, choice := "text_completion", func(i int) map[string]any { return map[string]any{"index": 0, "text": fmt.Sprintf("t%d ", i)} }
	if chat {
		object = "chat.completion"
		choice = func(i int) map[string]any {
			return map[string]any{"index": 0, "delta": map[string]string{"content": fmt.Sprintf("t%d ", i)}}
		}
	}
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
	for i := range e.chunks {
		if !send(map[string]any{"id": "cmpl-1", "object": object + ".chunk", "choices": []any{choice(i)}}) {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(e.delay):
		}
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		if !send(map[string]any{"id": "cmpl-1", "object": object + ".chunk", "choices": []any{}, "usage": usage}) {
			return
		}
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
}

// tokenize is vLLM's /tokenize with the word tokenizer.
func (e *fakeEngine) tokenize(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p, err := e.prompt(&req, req.Messages != nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	tokens, _ := gateway.WordTokenizer{}.Tokenize(r.Context(), &p, nil)
	_ = json.NewEncoder(w).Encode(map[string]any{"tokens": tokens, "count": len(tokens)})
}
