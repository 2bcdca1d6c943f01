package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/discovery"
	dyndisc "github.com/kvroute/kvroute/discovery/dynamo"
	kvdynamo "github.com/kvroute/kvroute/kvevents/dynamo"
	"github.com/kvroute/kvroute/router"
)

// The kvroute-lib arm runs kvroute's router inside the benchmark, for
// exploring policies without the gateway: prompts are tokenized ahead of
// time by tokenize_chats.py (the model's own tokenizer and template), the
// workers are discovered in Dynamo's file store and their KV events and
// load followed on Dynamo's event plane (packages discovery/dynamo and
// kvevents/dynamo), and each chat goes to the frontend in direct mode with
// the chosen worker in the x-dynamo-worker-instance-id header and its
// token ids in nvext.token_data, as the gateway sends them.

// libChooser routes with an in-process router.
type libChooser struct {
	r      *router.Router
	tokens map[*Request][]uint32
}

// Before implements Chooser.
func (c *libChooser) Before(ctx context.Context, r *Request) (http.Header, Hooks, error) {
	d, err := c.r.Select(ctx, &router.Request{Tokens: c.tokens[r], ExpectedOutputTokens: r.MaxTokens})
	if err != nil {
		return nil, Hooks{}, err
	}
	h := http.Header{}
	h.Set(workerHeader, strconv.FormatUint(uint64(d.Worker.ID), 10))
	return h, Hooks{
		Tokens:     c.tokens[r],
		FirstToken: d.PrefillDone,
		Done: func(res *Result) {
			res.Predicted = d.CachedTokens
			d.Done(router.Outcome{Err: res.Err, CachedTokens: res.CachedTokens, CachedTokensKnown: res.Err == nil})
		},
	}, nil
}

// tokenize returns the prompt token ids of every request of s.
func (b *bench) tokenize(ctx context.Context, s *Scenario) (map[*Request][]uint32, error) {
	var in bytes.Buffer
	enc := json.NewEncoder(&in)
	for i := range s.Requests {
		if err := enc.Encode(s.Requests[i].Messages); err != nil {
			return nil, err
		}
	}
	here, err := sourceDir()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, b.python, filepath.Join(here, "tokenize_chats.py"), b.o.model)
	cmd.Stdin = &in
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("tokenize_chats.py: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	ids := map[*Request][]uint32{}
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 16<<20)
	for i := 0; sc.Scan(); i++ {
		if i >= len(s.Requests) {
			return nil, fmt.Errorf("tokenize_chats.py: more lines than chats")
		}
		var t []uint32
		if err := json.Unmarshal(sc.Bytes(), &t); err != nil {
			return nil, fmt.Errorf("tokenize_chats.py line %d: %w", i+1, err)
		}
		ids[&s.Requests[i]] = t
	}
	if len(ids) != len(s.Requests) {
		return nil, fmt.Errorf("tokenize_chats.py: %d lines for %d chats", len(ids), len(s.Requests))
	}
	return ids, sc.Err()
}

// libState is what the kvroute-lib arm keeps between runs.
type libState struct {
	mu     sync.Mutex
	tokens map[string]map[*Request][]uint32 // by scenario
}

func setupLib(ctx context.Context, b *bench, d *Deployment, _ int) (string, Chooser, error) {
	return setupLibPolicy(ctx, b, d, b.o.libPolicy)
}

func setupLibPolicy(ctx context.Context, b *bench, d *Deployment, policy string) (string, Chooser, error) {
	s := d.scenario
	b.lib.mu.Lock()
	toks, ok := b.lib.tokens[s.Name]
	b.lib.mu.Unlock()
	if !ok {
		var err error
		if toks, err = b.tokenize(ctx, s); err != nil {
			return "", nil, err
		}
		b.lib.mu.Lock()
		if b.lib.tokens == nil {
			b.lib.tokens = map[string]map[*Request][]uint32{}
		}
		b.lib.tokens[s.Name] = toks
		b.lib.mu.Unlock()
	}
	cfg, pol, err := libConfig(policy)
	if err != nil {
		return "", nil, err
	}
	r, err := router.New(cfg)
	if err != nil {
		return "", nil, err
	}
	load, stopLoad := loadReporter(r, pol)
	// The workers, their KV events and their load come from Dynamo's own
	// discovery store and event plane, as in the gateway's Dynamo mode.
	sub, err := kvdynamo.New(kvdynamo.Config{Sink: r.Index(), Load: load})
	if err != nil {
		return "", nil, err
	}
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, DynamoEvents: dyndisc.KVEvents(sub)})
	if err != nil {
		return "", nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	d.onStop(func() { cancel(); wg.Wait(); stopLoad(); _ = pool.Close() })
	wg.Go(func() { _ = sub.Run(runCtx) })
	w := &dyndisc.FileWatcher{Dir: filepath.Join(d.dir, "kv"), Selector: dyndisc.Selector{Model: modelName}}
	wg.Go(func() { _ = w.Run(runCtx, dyndisc.PoolSink(pool, sub)) })
	// Wait until every worker is routable.
	deadline := time.Now().Add(30 * time.Second)
	for len(r.Workers()) < b.o.workers {
		if time.Now().After(deadline) {
			return "", nil, fmt.Errorf("kvroute discovered %d of %d workers in 30 s (rejected: %v)", len(r.Workers()), b.o.workers, pool.Rejected())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", d.httpPort), &libChooser{r: r, tokens: toks}, nil
}
