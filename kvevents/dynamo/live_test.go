package dynamo_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/internal/loopback"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/dynamo"
	kvzmq "github.com/kvroute/kvroute/kvevents/zmq"
	"github.com/kvroute/kvroute/scheduling"
)

// dynamoPython returns the interpreter and PYTHONPATH that import
// ai-dynamo-runtime's dynamo._core (KVROUTE_DYNAMO_PYTHON, default
// python3; KVROUTE_DYNAMO_PYTHONPATH, set by .ci/setup-dynamo.sh), or
// skips the test naming what is missing (fails it under
// KVROUTE_EXTERNAL_TESTS=1).
func dynamoPython(t *testing.T) (string, string) {
	t.Helper()
	py := os.Getenv("KVROUTE_DYNAMO_PYTHON")
	if py == "" {
		py = "python3"
	}
	path := os.Getenv("KVROUTE_DYNAMO_PYTHONPATH")
	var missing string
	if _, err := exec.LookPath(py); err != nil {
		missing = py
	} else {
		cmd := exec.Command(py, "-c", "import dynamo._core")
		cmd.Env = append(os.Environ(), "PYTHONPATH="+path)
		if out, err := cmd.CombinedOutput(); err != nil {
			missing = fmt.Sprintf("ai-dynamo-runtime 1.6.1 for %s (%s)", py, strings.TrimSpace(string(out)))
		}
	}
	if missing == "" {
		return py, path
	}
	if os.Getenv("KVROUTE_EXTERNAL_TESTS") == "1" {
		t.Fatalf("missing %s (KVROUTE_EXTERNAL_TESTS=1)", missing)
	}
	t.Skipf("missing %s; source .ci/setup-dynamo.sh with CI=true, or set KVROUTE_DYNAMO_PYTHON/KVROUTE_DYNAMO_PYTHONPATH to a Python with ai-dynamo-runtime==1.6.1", missing)
	return "", ""
}

// relay is Dynamo's KvEventPublisher relaying a vLLM-format ZMQ stream onto
// its event plane, plus its WorkerMetricsPublisher (testdata/relay.py).
type relay struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Scanner
	dir    string // DYN_FILE_KV
}

func startRelay(t *testing.T, vllmEndpoint string, blockSize int, env ...string) (*relay, kvroute.WorkerID) {
	py, path := dynamoPython(t)
	dir := t.TempDir()
	cmd := exec.Command(py, "testdata/relay.py", vllmEndpoint, fmt.Sprint(blockSize))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+path, "DYN_FILE_KV="+dir, "DYN_LOG=warn",
		"DYN_EVENT_PLANE_HOST=127.0.0.1", "DYN_TCP_RPC_HOST=127.0.0.1",
		"DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1", "DYN_SYSTEM_HOST=127.0.0.1", "NO_COLOR=1")
	cmd.Env = append(cmd.Env, env...)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	r := &relay{cmd: cmd, stdin: stdin, stdout: bufio.NewScanner(out), dir: dir}
	t.Cleanup(func() {
		stdin.Close() // end of input stops the relay
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("relay stderr:\n%s", stderr.String())
		}
	})
	var worker kvroute.WorkerID
	_, err = fmt.Sscanf(r.line(t), "ready %d", &worker)
	require.NoError(t, err)
	return r, worker
}

// expect reads the relay's next line of output and checks it.
func (r *relay) expect(t *testing.T, want string) {
	t.Helper()
	require.Equal(t, want, r.line(t))
}

// line reads the relay's next line of output, within 30 s.
func (r *relay) line(t *testing.T) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		if r.stdout.Scan() {
			got <- r.stdout.Text()
		}
		close(got)
	}()
	select {
	case line, ok := <-got:
		if !ok {
			t.Fatal("relay exited")
		}
		return line
	case <-time.After(30 * time.Second):
		t.Fatal("relay printed nothing for 30 s")
	}
	return ""
}

func (r *relay) command(t *testing.T, format string, args ...any) {
	t.Helper()
	_, err := fmt.Fprintf(r.stdin, format+"\n", args...)
	require.NoError(t, err)
	r.expect(t, "ok")
}

// channels reads the event channels the relay registered in Dynamo's file
// discovery: by topic, the ZMQ endpoint, or the NATS subject (the subject
// prefix and the topic).
func (r *relay) channels(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(r.dir, "v1", "event_channels", "*"))
	require.NoError(t, err)
	out := make(map[string]string)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil || len(raw) == 0 {
			continue // being written
		}
		var ch struct {
			Topic     string `json:"topic"`
			Transport struct {
				Kind   string `json:"kind"`
				Config struct {
					Endpoint      string `json:"endpoint"`
					SubjectPrefix string `json:"subject_prefix"`
				} `json:"config"`
			} `json:"transport"`
		}
		if json.Unmarshal(raw, &ch) != nil {
			continue // being written
		}
		switch ch.Transport.Kind {
		case "Zmq":
			out[ch.Topic] = ch.Transport.Config.Endpoint
		case "Nats":
			out[ch.Topic] = ch.Transport.Config.SubjectPrefix + "." + ch.Topic
		}
	}
	return out
}

// recoveryTarget reads the recovery target of the relay's kv-events
// publisher from Dynamo's file discovery (v1/event_sources).
func (r *relay) recoveryTarget(t *testing.T) (dynamo.RecoveryTarget, bool) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(r.dir, "v1", "event_sources", "*"))
	require.NoError(t, err)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var src struct {
			Topic    string `json:"topic"`
			Metadata struct {
				Worker struct {
					WorkerID uint64 `json:"worker_id"`
					DPRank   uint32 `json:"dp_rank"`
				} `json:"worker"`
				Recovery struct {
					Transport struct {
						TCP string `json:"tcp"`
					} `json:"transport"`
				} `json:"recovery_target"`
			} `json:"metadata"`
		}
		if json.Unmarshal(raw, &src) != nil || src.Topic != dynamo.TopicKVEvents {
			continue // being written
		}
		tgt, err := dynamo.ParseRecoveryTarget(src.Metadata.Recovery.Transport.TCP, src.Metadata.Worker.WorkerID, src.Metadata.Worker.DPRank)
		require.NoError(t, err)
		return tgt, true
	}
	return dynamo.RecoveryTarget{}, false
}

// loadLog records heartbeats.
type loadLog struct {
	mu   sync.Mutex
	last map[kvroute.WorkerKey]scheduling.Load
}

func (l *loadLog) Heartbeat(w kvroute.WorkerKey, load scheduling.Load) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = make(map[kvroute.WorkerKey]scheduling.Load)
	}
	l.last[w] = load
	return nil
}

func (l *loadLog) get(w kvroute.WorkerKey) (scheduling.Load, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.last[w]
	return v, ok
}

func freeEndpoint(t *testing.T) string {
	t.Helper()
	port, err := loopback.FreePort()
	require.NoError(t, err)
	return "tcp://127.0.0.1:" + strconv.Itoa(port)
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool, poke func()) {
	t.Helper()
	for !cond() {
		if poke != nil {
			poke()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// liveRun is one live run: a vLLM-format PUB socket, Dynamo's relay
// republishing it on its event plane, and two indexes fed from each.
type liveRun struct {
	t         *testing.T
	ctx       context.Context
	pub       zmq4.Socket
	seq       uint64
	rank      int64 // the data-parallel rank the vLLM-format batches name
	relay     *relay
	worker    kvroute.WorkerID
	chans     map[string]string
	direct    *indexer.Index
	viaDynamo *indexer.Index
	zsub      *kvzmq.Subscriber
	loads     *loadLog
}

const (
	liveBlock    = 16
	liveCapacity = 800
)

var liveHasher = kvroute.MustHasher(kvroute.HasherConfig{BlockSize: liveBlock})

// startLive starts the relay (with env) and the direct path; the caller
// runs its Dynamo subscriber into r.viaDynamo and r.loads.
func startLive(t *testing.T, ctx context.Context, env ...string) *liveRun {
	pubEP := freeEndpoint(t)
	r := &liveRun{t: t, ctx: ctx, pub: zmq4.NewPub(ctx), loads: &loadLog{}}
	t.Cleanup(func() { r.pub.Close() })
	require.NoError(t, r.pub.Listen(pubEP))
	r.relay, r.worker = startRelay(t, pubEP, liveBlock, env...)
	// The publishers register their channels in the background.
	waitFor(t, ctx, "the relay's event channels", func() bool {
		r.chans = r.relay.channels(t)
		return r.chans[dynamo.TopicKVEvents] != "" && r.chans[dynamo.TopicKVMetrics] != ""
	}, nil)
	var err error
	r.direct, err = indexer.New(indexer.Config{Hasher: liveHasher})
	require.NoError(t, err)
	r.viaDynamo, err = indexer.New(indexer.Config{Hasher: liveHasher})
	require.NoError(t, err)
	r.zsub, err = kvzmq.New(kvzmq.Config{Endpoint: pubEP, Sink: r.direct,
		Converter: kvevents.ConverterConfig{Worker: r.worker, BlockSize: liveBlock}})
	require.NoError(t, err)
	r.run(r.zsub.Run)
	return r
}

// run runs a subscriber until the test ends.
func (r *liveRun) run(run func(context.Context) error) {
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = run(ctx) }()
	r.t.Cleanup(func() { cancel(); <-done })
}

// send publishes a vLLM-format batch.
func (r *liveRun) send(evs ...kvevents.EngineEvent) {
	p, err := kvevents.AppendBatch(nil, &kvevents.Batch{Timestamp: float64(r.seq), Events: evs, RankSlot: true, DPRank: kvevents.Some(r.rank)})
	require.NoError(r.t, err)
	var b [8]byte
	for i := range 8 {
		b[i] = byte(r.seq >> (56 - 8*i))
	}
	r.seq++
	require.NoError(r.t, r.pub.SendMulti(zmq4.NewMsgFrom([]byte("kv-events"), b[:], p)))
}

// prompts returns n prompts sharing system prompts (3 blocks shared by
// prompts with the same i%3), each with 1-4 own blocks and a partial one;
// seed keeps sets apart.
func prompts(seed, n int) [][]uint32 {
	out := make([][]uint32, 0, n)
	for i := range n {
		sys := make([]uint32, 48)
		for j := range sys {
			sys[j] = uint32(1000*(i%3) + j)
		}
		user := make([]uint32, liveBlock*(1+i%4)+5)
		for j := range user {
			user[j] = uint32(50000 + 10000*seed + 100*i + j)
		}
		out = append(out, append(sys, user...))
	}
	return out
}

// ext is the engine's block hash the tests publish for a block.
func ext(s kvroute.SeqHash) kvevents.Hash { return kvevents.UintHash(uint64(s) ^ 0x5bd1e995) }

// publish stores the prompts' blocks not in stored (one event per prompt,
// with its parent) and evicts the last block of every fourth prompt.
func (r *liveRun) publish(ps [][]uint32, stored map[kvroute.SeqHash]bool) {
	for i, p := range ps {
		seqs := liveHasher.AppendSeqHashes(nil, p)
		first := 0
		for first < len(seqs) && stored[seqs[first]] {
			first++
		}
		if first < len(seqs) {
			ev := kvevents.EngineEvent{Type: kvevents.BlockStored, Layout: kvevents.LayoutMap, BlockSize: liveBlock,
				TokenIDs: p[first*liveBlock : len(seqs)*liveBlock]}
			if first > 0 {
				ev.ParentBlockHash = ext(seqs[first-1])
			}
			for _, s := range seqs[first:] {
				ev.BlockHashes = append(ev.BlockHashes, ext(s))
				stored[s] = true
			}
			r.send(ev)
		}
		if i%4 == 3 {
			last := seqs[len(seqs)-1]
			r.send(kvevents.EngineEvent{Type: kvevents.BlockRemoved, Layout: kvevents.LayoutMap, BlockHashes: []kvevents.Hash{ext(last)}})
			delete(stored, last)
		}
	}
}

// storeOne publishes a store of one root block of tokens base.. and
// returns its sequence hashes.
func (r *liveRun) storeOne(base int) []kvroute.SeqHash {
	toks := make([]uint32, liveBlock)
	for j := range toks {
		toks[j] = uint32(base + j)
	}
	ss := liveHasher.AppendSeqHashes(nil, toks)
	r.send(kvevents.EngineEvent{Type: kvevents.BlockStored, Layout: kvevents.LayoutMap, BlockSize: liveBlock, TokenIDs: toks,
		BlockHashes: []kvevents.Hash{ext(ss[0])}})
	return ss
}

// holds reports whether ix holds the blocks of seqs.
func holds(ix *indexer.Index, seqs []kvroute.SeqHash) func() bool {
	return func() bool {
		var res indexer.MatchResult
		ix.Match(seqs, &res)
		return res.Blocks == len(seqs)
	}
}

// compare checks that both indexes match every prompt (and one never
// stored) to the same workers and depths, and that every prompt matches.
func (r *liveRun) compare(ps [][]uint32) {
	matched := 0
	for i, p := range append(ps, []uint32{7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}) {
		seqs := liveHasher.AppendSeqHashes(nil, p)
		var a, b indexer.MatchResult
		r.direct.Match(seqs, &a)
		r.viaDynamo.Match(seqs, &b)
		require.Equal(r.t, a.Blocks, b.Blocks, "prompt %d", i)
		require.ElementsMatch(r.t, a.Workers, b.Workers, "prompt %d", i)
		if a.Blocks > 0 {
			matched++
			require.Equal(r.t, kvroute.WorkerKey{ID: r.worker}, b.Workers[0].Worker)
		}
	}
	require.Equal(r.t, len(ps), matched, "every stored prompt matches")
}

// checkParity publishes prompts once, after both paths have joined, and
// compares the indexes. applied reports the Dynamo subscriber's applied
// clears.
func (r *liveRun) checkParity(applied func() uint64) {
	// ZMQ subscribers join late: publish clears (idempotent) until both
	// paths have seen one.
	waitFor(r.t, r.ctx, "both paths to receive", func() bool {
		return r.zsub.Stats().AppliedCleared > 0 && applied() > 0
	}, func() { r.send(kvevents.EngineEvent{Type: kvevents.AllBlocksCleared, Layout: kvevents.LayoutMap}) })
	ps := prompts(0, 12)
	r.publish(ps, make(map[kvroute.SeqHash]bool))
	// A sentinel stored last: once both indexes hold it, they hold
	// everything before it.
	ss := r.storeOne(90000)
	waitFor(r.t, r.ctx, "the sentinel through kvevents/zmq", holds(r.direct, ss), nil)
	waitFor(r.t, r.ctx, "the sentinel through Dynamo's event plane", holds(r.viaDynamo, ss), nil)
	r.compare(ps)
}

// checkLoad has Dynamo's WorkerMetricsPublisher publish kv_metrics until
// the last one arrives as a heartbeat.
func (r *liveRun) checkLoad() {
	w := kvroute.WorkerKey{ID: r.worker}
	var n int
	waitFor(r.t, r.ctx, "a kv_metrics heartbeat", func() bool {
		l, ok := r.loads.get(w)
		return ok && l.ActiveDecodeBlocks == 3+n-1 && l.KVUtilization == float64(200+n-1)/liveCapacity
	}, func() {
		r.relay.command(r.t, "load 0 %d %d", 3+n, 200+n)
		n++
	})
	l, _ := r.loads.get(w)
	require.Equal(r.t, liveCapacity, l.KVCapacityBlocks)
}

// check runs a Dynamo subscriber and checks it against the direct path:
// index parity, kv_metrics heartbeats, nothing malformed or refused.
func (r *liveRun) check(run func(context.Context) error, stats func() dynamo.Stats) {
	r.run(run)
	r.checkParity(func() uint64 { return stats().AppliedCleared })
	r.checkLoad()
	st := stats()
	r.t.Logf("subscriber: %+v", st)
	require.Zero(r.t, st.Malformed)
	require.Zero(r.t, st.ApplyErrs)
}

// TestLiveZMQ publishes vLLM-format KV events once and indexes them
// twice: directly (kvevents/zmq, kvroute hashing the tokens) and through
// Dynamo's own KvEventPublisher relay and ZMQ event plane (Subscriber,
// Dynamo hashing the tokens). Every prompt must match the same workers and
// depths in both indexes; Dynamo's kv_metrics must arrive as heartbeats.
func TestLiveZMQ(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	r := startLive(t, ctx)
	sub, err := dynamo.New(dynamo.Config{Sink: r.viaDynamo, Load: r.loads})
	require.NoError(t, err)
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: r.chans[dynamo.TopicKVEvents], Topic: dynamo.TopicKVEvents}))
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: r.chans[dynamo.TopicKVMetrics], Topic: dynamo.TopicKVMetrics,
		KVCapacityBlocks: liveCapacity, BlockSize: liveBlock}))
	r.check(sub.Run, sub.Stats)
}

// TestLiveRecovery checks the recovery from the worker's local indexer
// (Dynamo's KvEventPublisher with enable_local_indexer, queried on
// Dynamo's TCP request plane): a subscriber that joins after the worker
// cached prompts restores them from a dump as soon as the publisher is
// added, events it misses (dropped by a proxy) are fetched on the next
// event's gap, and a publisher removed and added again is restored from a
// dump again.
func TestLiveRecovery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	r := startLive(t, ctx)
	var tgt dynamo.RecoveryTarget
	waitFor(t, ctx, "the relay's recovery target", func() bool {
		var ok bool
		tgt, ok = r.relay.recoveryTarget(t)
		return ok
	}, nil)
	require.Equal(t, uint64(r.worker), tgt.WorkerID)
	q := dynamo.Querier{Timeout: 5 * time.Second}
	// relayHas waits until the relay's local indexer holds seqs' block.
	relayHas := func(seqs []kvroute.SeqHash) {
		waitFor(t, ctx, "the relay to index the sentinel", func() bool {
			resp, err := q.Query(ctx, tgt, nil, nil)
			if err != nil {
				return false
			}
			for _, e := range resp.Events {
				for _, b := range e.Blocks {
					if b.BlockHash == ext(seqs[0]).Key {
						return true
					}
				}
			}
			return false
		}, nil)
	}

	// Before the Dynamo subscriber exists: the relay caches part 1.
	waitFor(t, ctx, "the direct path to receive", func() bool { return r.zsub.Stats().AppliedCleared > 0 },
		func() { r.send(kvevents.EngineEvent{Type: kvevents.AllBlocksCleared, Layout: kvevents.LayoutMap}) })
	stored := make(map[kvroute.SeqHash]bool)
	part1 := prompts(1, 9)
	r.publish(part1, stored)
	relayHas(r.storeOne(91000))

	// The subscriber follows the relay through a proxy that can drop
	// messages.
	proxy := startProxy(t, ctx, r.chans[dynamo.TopicKVEvents])
	sub, err := dynamo.New(dynamo.Config{Sink: r.viaDynamo, Query: q})
	require.NoError(t, err)
	pub := dynamo.Publisher{Endpoint: proxy.ep, Topic: dynamo.TopicKVEvents, Recovery: &tgt}
	require.NoError(t, sub.AddPublisher(pub))
	r.run(sub.Run)
	// Added with its recovery target, the worker is restored from a dump
	// before it publishes anything.
	waitFor(t, ctx, "the dump", func() bool { return sub.Stats().Restored == 1 }, nil)
	r.compare(part1)
	// Stores of fresh blocks until the subscriber hears one through the
	// proxy.
	base := 92000
	probe := r.storeOne(base)
	base += liveBlock
	waitFor(t, ctx, "the Dynamo subscriber to receive", func() bool {
		return sub.Stats().Received > 0 && holds(r.viaDynamo, probe)()
	}, func() { probe = r.storeOne(base); base += liveBlock })
	waitFor(t, ctx, "the direct path to catch up", holds(r.direct, probe), nil)
	st := sub.Stats()
	require.Equal(t, uint64(1), st.Restored, "%+v", st)
	r.compare(part1)
	fromDump := st.Recovered

	// Part 2 is published while the proxy drops every message; the next
	// live event shows a gap in event ids, and the missing events are
	// fetched from the worker.
	proxy.drop.Store(true)
	part2 := prompts(2, 9)
	r.publish(part2, stored)
	relayHas(r.storeOne(93000))
	// The relay's local indexer can hold the blocks before its publisher
	// has sent them: keep dropping until at least one is dropped, so that
	// the next live event shows a gap.
	waitFor(t, ctx, "the proxy to drop an event", func() bool { return proxy.dropped.Load() > 0 }, nil)
	proxy.drop.Store(false)
	probe = r.storeOne(base)
	base += liveBlock
	waitFor(t, ctx, "a live event after the gap", func() bool {
		return holds(r.viaDynamo, probe)()
	}, func() { probe = r.storeOne(base); base += liveBlock })
	waitFor(t, ctx, "the direct path to catch up", holds(r.direct, probe), nil)
	st = sub.Stats()
	t.Logf("subscriber: %+v", st)
	require.NotZero(t, st.EventGaps)
	// The events fetched from the worker since the dump are exactly those
	// of the messages the proxy dropped. How many there were depends on
	// how far the relay's publisher had got when dropping stopped.
	dropped := uint64(proxy.droppedEvents.Load())
	require.NotZero(t, dropped, "the proxy dropped %d messages with no event in them", proxy.dropped.Load())
	require.Equal(t, dropped, st.Recovered-fromDump, "%d events recovered from the dump; %+v", fromDump, st)
	require.Zero(t, st.LostEvents)
	require.Zero(t, st.QueryErrs)
	require.Zero(t, st.ApplyErrs)
	r.compare(append(part1, part2...))

	// Removed and added again, the worker is restored from a dump at once.
	sub.RemovePublisher(pub.Endpoint)
	part3 := prompts(3, 9)
	r.publish(part3, stored)
	relayHas(r.storeOne(94000))
	require.NoError(t, sub.AddPublisher(pub))
	waitFor(t, ctx, "the second dump", func() bool { return sub.Stats().Restored == 2 }, nil)
	waitFor(t, ctx, "the direct path to catch up", holds(r.direct, liveHasher.AppendSeqHashes(nil, tokens(94000, liveBlock))), nil)
	r.compare(append(append(part1, part2...), part3...))
	t.Logf("subscriber: %+v", sub.Stats())
}

// zmqProxy forwards a PUB socket's messages to a PUB socket of its own,
// dropping them while drop is set.
type zmqProxy struct {
	ep      string
	drop    atomic.Bool
	dropped atomic.Int64 // messages dropped
	// droppedEvents counts the RouterEvents in the messages dropped.
	droppedEvents atomic.Int64
}

func startProxy(t *testing.T, ctx context.Context, upstream string) *zmqProxy {
	p := &zmqProxy{ep: freeEndpoint(t)}
	in, out := zmq4.NewSub(ctx), zmq4.NewPub(ctx)
	require.NoError(t, out.Listen(p.ep))
	require.NoError(t, in.Dial(upstream))
	require.NoError(t, in.SetOption(zmq4.OptionSubscribe, ""))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := in.Recv()
			if err != nil {
				return
			}
			if p.drop.Load() {
				p.dropped.Add(1)
				var msg dynamo.Message
				if err := dynamo.DecodeZMQ(m.Frames, &msg); err == nil {
					if evs, err := dynamo.DecodeRouterEvents(nil, msg.Envelope.Payload); err == nil {
						p.droppedEvents.Add(int64(len(evs)))
					}
				}
				continue
			}
			_ = out.Send(m)
		}
	}()
	t.Cleanup(func() { in.Close(); out.Close(); <-done })
	return p
}

// TestLiveNATS is TestLiveZMQ on Dynamo's NATS event plane (an in-process
// NATS server), with NATSSubscriber.
func TestLiveNATS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	nc, url := startNATS(t)
	r := startLive(t, ctx, "KVROUTE_EVENT_PLANE=nats", "NATS_SERVER="+url)
	require.Equal(t, dynamo.Subject("kvroute", "relay", "generate", dynamo.TopicKVEvents), r.chans[dynamo.TopicKVEvents])
	sub, err := dynamo.NewNATS(dynamo.NATSConfig{Conn: nc, Sink: r.viaDynamo, Load: r.loads})
	require.NoError(t, err)
	require.NoError(t, sub.AddChannel(dynamo.NATSChannel{Subject: r.chans[dynamo.TopicKVEvents]}))
	require.NoError(t, sub.AddChannel(dynamo.NATSChannel{Subject: r.chans[dynamo.TopicKVMetrics],
		KVCapacityBlocks: liveCapacity, BlockSize: liveBlock}))
	r.check(sub.Run, sub.Stats)
}

// TestLiveDPStartRank: Dynamo's own KvEventPublisher and
// WorkerMetricsPublisher publishing for data-parallel rank 3 of a worker
// whose ranks start at 2 (multi-node data parallelism): with the start
// rank set, its events, recovery dump and load reports are the router's
// rank 1.
func TestLiveDPStartRank(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	r := startLive(t, ctx, "KVROUTE_DP_RANK=3")
	r.rank = 3 // as vLLM's rank 3 names its batches
	rel := kvroute.WorkerKey{ID: r.worker, Rank: 1}
	// Stored before the subscriber joins: only the dump brings it.
	// (Published until the direct path has it: ZMQ subscribers join late.)
	early := r.storeOne(70000)
	waitFor(t, ctx, "the early store through kvevents/zmq", holds(r.direct, early), func() { r.storeOne(70000) })
	tgt, ok := r.relay.recoveryTarget(t)
	require.True(t, ok, "the relay has a local indexer")
	require.Equal(t, uint32(3), tgt.DPRank, "its event source names Dynamo's rank")
	sub, err := dynamo.New(dynamo.Config{Sink: r.viaDynamo, Load: r.loads})
	require.NoError(t, err)
	require.NoError(t, sub.SetDPStartRanks(map[uint64]int{uint64(r.worker): 2}))
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: r.chans[dynamo.TopicKVEvents], Topic: dynamo.TopicKVEvents, Recovery: &tgt}))
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: r.chans[dynamo.TopicKVMetrics], Topic: dynamo.TopicKVMetrics,
		KVCapacityBlocks: liveCapacity, BlockSize: liveBlock}))
	r.run(sub.Run)
	waitFor(t, ctx, "the dump", holds(r.viaDynamo, early), nil)
	var live []kvroute.SeqHash
	waitFor(t, ctx, "a live store", func() bool { return live != nil && holds(r.viaDynamo, live)() }, func() {
		live = r.storeOne(71000 + int(r.seq))
	})
	for _, seqs := range [][]kvroute.SeqHash{early, live} {
		var m indexer.MatchResult
		r.viaDynamo.Match(seqs, &m)
		require.Len(t, m.Workers, 1)
		require.Equal(t, rel, m.Workers[0].Worker)
	}
	waitFor(t, ctx, "a kv_metrics heartbeat of rank 1", func() bool {
		l, ok := r.loads.get(rel)
		return ok && l.KVUtilization == 300.0/liveCapacity
	}, func() { r.relay.command(t, "load 3 4 300") })
	_, ok = r.loads.get(kvroute.WorkerKey{ID: r.worker, Rank: 3})
	require.False(t, ok, "nothing under Dynamo's rank")
	st := sub.Stats()
	t.Logf("subscriber: %+v", st)
	require.Zero(t, st.Malformed)
	require.Zero(t, st.ApplyErrs)
	require.Equal(t, uint64(1), st.Restored)
}

// TestLiveNATSSharedSubject: two workers (two of Dynamo's own
// KvEventPublisher relays) serve one endpoint on Dynamo's NATS event plane
// and so publish on one subject; the NATSSubscriber subscribes to it once
// and indexes each worker's blocks, and takes each worker's load reports,
// under that worker, by what each message names.
func TestLiveNATSSharedSubject(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	nc, url := startNATS(t)
	a := startLive(t, ctx, "KVROUTE_EVENT_PLANE=nats", "NATS_SERVER="+url)
	b := startLive(t, ctx, "KVROUTE_EVENT_PLANE=nats", "NATS_SERVER="+url)
	require.NotEqual(t, a.worker, b.worker)
	require.Equal(t, a.chans[dynamo.TopicKVEvents], b.chans[dynamo.TopicKVEvents], "one subject")
	ix, err := indexer.New(indexer.Config{Hasher: liveHasher})
	require.NoError(t, err)
	loads := &loadLog{}
	sub, err := dynamo.NewNATS(dynamo.NATSConfig{Conn: nc, Sink: ix, Load: loads})
	require.NoError(t, err)
	require.NoError(t, sub.AddChannel(dynamo.NATSChannel{Subject: a.chans[dynamo.TopicKVEvents]}))
	require.NoError(t, sub.AddChannel(dynamo.NATSChannel{Subject: a.chans[dynamo.TopicKVMetrics],
		KVCapacityBlocks: liveCapacity, BlockSize: liveBlock}))
	a.run(sub.Run)
	for i, r := range []*liveRun{a, b} {
		base := 80000 + 1000*i
		var seqs []kvroute.SeqHash
		waitFor(t, ctx, "a worker's store", func() bool { return seqs != nil && holds(ix, seqs)() }, func() { seqs = r.storeOne(base) })
		var m indexer.MatchResult
		ix.Match(seqs, &m)
		require.Len(t, m.Workers, 1)
		require.Equal(t, kvroute.WorkerKey{ID: r.worker}, m.Workers[0].Worker, "worker %d", i)
		used := 100 * (i + 1)
		waitFor(t, ctx, "a worker's kv_metrics", func() bool {
			l, ok := loads.get(kvroute.WorkerKey{ID: r.worker})
			return ok && l.KVUtilization == float64(used)/liveCapacity
		}, func() { r.relay.command(t, "load 0 2 %d", used) })
	}
	st := sub.Stats()
	t.Logf("subscriber: %+v", st)
	require.Equal(t, uint64(2), st.Reconnects, "one subscription per subject")
	require.Zero(t, st.Gaps, "each publisher's sequence is its own")
	require.Zero(t, st.Malformed)
	require.Zero(t, st.ApplyErrs)
	require.Zero(t, st.Duplicates)
}
