package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
	kvzmq "github.com/kvroute/kvroute/kvevents/zmq"
	"github.com/kvroute/kvroute/router"
)

// The kvroute-lib arm runs kvroute's router inside the benchmark, for
// exploring policies without the gateway: prompts are tokenized ahead of
// time by tokenize_chats.py (the model's own tokenizer and template), the
// workers publish vLLM-format KV events on their own ZMQ ports
// (--zmq-kv-events-ports) that kvroute's subscriber feeds into the
// router's index, and each chat goes to the frontend in direct mode with
// the chosen worker in the x-dynamo-worker-instance-id header.

// libChooser routes with an in-process router.
type libChooser struct {
	r      *router.Router
	tokens map[*Request][]uint32
}

// Before implements Chooser.
func (c *libChooser) Before(ctx context.Context, r *Request) (http.Header, func(*Result), error) {
	d, err := c.r.Select(ctx, &router.Request{Tokens: c.tokens[r], ExpectedOutputTokens: r.MaxTokens})
	if err != nil {
		return nil, nil, err
	}
	h := http.Header{}
	h.Set(workerHeader, strconv.FormatUint(uint64(d.Worker.ID), 10))
	return h, func(res *Result) {
		res.Predicted = d.CachedTokens
		d.PrefillDone()
		d.Done(router.Outcome{Err: res.Err, CachedTokens: res.CachedTokens, CachedTokensKnown: res.Err == nil})
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
	cfg, err := libConfig(b.o.libPolicy)
	if err != nil {
		return "", nil, err
	}
	r, err := router.New(cfg)
	if err != nil {
		return "", nil, err
	}
	ids, err := d.workerEventPorts()
	if err != nil {
		return "", nil, err
	}
	if len(ids) == 0 {
		return "", nil, errors.New("no worker in the file store")
	}
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	d.onStop(func() { cancel(); wg.Wait() })
	for id, port := range ids {
		w := router.StaticWorker{WorkerID: kvroute.WorkerID(id), Block: 16, CapacityBlocks: s.CacheBlocks}
		if err := r.AddWorker(w); err != nil {
			return "", nil, err
		}
		sub, err := kvzmq.New(kvzmq.Config{
			Endpoint:  fmt.Sprintf("tcp://127.0.0.1:%d", port),
			Converter: kvevents.ConverterConfig{Worker: kvroute.WorkerID(id), BlockSize: 16},
			Sink:      r.Index(),
		})
		if err != nil {
			return "", nil, err
		}
		wg.Go(func() { _ = sub.Run(runCtx) })
	}
	return fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", d.httpPort), &libChooser{r: r, tokens: toks}, nil
}

// workerEventPorts maps each worker's instance id to its vLLM-format KV
// event port: the instance's request-plane TCP port (in the file store)
// is owned by one of the mocker processes, whose event port the benchmark
// chose.
func (d *Deployment) workerEventPorts() (map[uint64]int, error) {
	inst, err := instanceRPCPorts(filepath.Join(d.dir, "kv"))
	if err != nil {
		return nil, err
	}
	listen, err := listeningInodes()
	if err != nil {
		return nil, err
	}
	out := map[uint64]int{}
	for id, rpc := range inst {
		inode, ok := listen[rpc]
		if !ok {
			return nil, fmt.Errorf("instance %d: nothing listens on port %d", id, rpc)
		}
		for _, p := range d.procs {
			if p.eventPort != 0 && ownsSocket(p.cmd.Process.Pid, inode) {
				out[id] = p.eventPort
			}
		}
		if _, ok := out[id]; !ok {
			return nil, fmt.Errorf("instance %d: no mocker owns port %d", id, rpc)
		}
	}
	return out, nil
}

// instanceRPCPorts returns the request-plane TCP port of every generate
// instance in the file store.
func instanceRPCPorts(kvDir string) (map[uint64]int, error) {
	inst, err := Instances(kvDir)
	if err != nil {
		return nil, err
	}
	out := map[uint64]int{}
	for _, in := range inst {
		_, port, ok := strings.Cut(in.RPC, ":")
		n, err := strconv.Atoi(port)
		if !ok || err != nil {
			return nil, fmt.Errorf("instance %d: request-plane address %q has no port", in.ID, in.RPC)
		}
		out[in.ID] = n
	}
	return out, nil
}

// listeningInodes maps listening TCP ports to their socket inodes
// (/proc/net/tcp).
func listeningInodes() (map[int]string, error) {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
			continue
		}
		_, hexPort, _ := strings.Cut(f[1], ":")
		port, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil {
			continue
		}
		out[int(port)] = f[9]
	}
	return out, nil
}

// ownsSocket reports whether process pid has the socket inode open.
func ownsSocket(pid int, inode string) bool {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false
	}
	want := "socket:[" + inode + "]"
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && l == want {
			return true
		}
	}
	return false
}
