package zmq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/internal/loopback"
	"github.com/kvroute/kvroute/kvevents"
	kvzmq "github.com/kvroute/kvroute/kvevents/zmq"
)

const (
	python = "/usr/bin/python3"
	// publisher is a copy of the reference publisher that
	// kvevents/testdata/README.md describes.
	publisher = "testdata/kvevents_publisher.py"
)

// requireExternal skips the test (or fails it under KVROUTE_EXTERNAL_TESTS=1)
// when Debian's python3 with python3-zmq and python3-msgpack is missing.
func requireExternal(t *testing.T) {
	t.Helper()
	var missing string
	if _, err := os.Stat(python); err != nil {
		missing = python
	} else if _, err := os.Stat(publisher); err != nil {
		missing = publisher
	} else if out, err := exec.Command(python, "-c", "import zmq, msgpack").CombinedOutput(); err != nil {
		missing = "python3-zmq and python3-msgpack for " + python + " (" + string(out) + ")"
	}
	if missing == "" {
		return
	}
	if os.Getenv("KVROUTE_EXTERNAL_TESTS") == "1" {
		t.Fatalf("missing %s (KVROUTE_EXTERNAL_TESTS=1)", missing)
	}
	t.Skipf("missing %s; install python3-zmq python3-msgpack (Debian) or set KVROUTE_EXTERNAL_TESTS=1 to require them", missing)
}

// freePorts finds n consecutive free loopback TCP ports below the
// ephemeral range (loopback.FreePorts), so that no process binding port
// 0 meanwhile takes one of them.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	base, err := loopback.FreePorts(n)
	require.NoError(t, err)
	return base
}

// publisherDump is the part of kvevents_publisher.py's --dump we check.
type publisherDump struct {
	FinalState []struct {
		Worker  int    `json:"worker"`
		DPRank  uint32 `json:"dp_rank"`
		LastSeq int64  `json:"last_seq"`
		Blocks  []struct {
			BlockHash string   `json:"block_hash"`
			Parent    *string  `json:"parent_block_hash"`
			TokenIDs  []uint32 `json:"token_ids"`
		} `json:"blocks"`
	} `json:"final_state"`
	Batches []struct {
		Dropped bool `json:"dropped"`
	} `json:"batches"`
}

// expectedBlocks computes, from the dump's final state, the sequence hashes
// each worker must hold: chain every block's token hash onto its parent's.
func expectedBlocks(t *testing.T, d *publisherDump, id kvroute.WorkerID, blockSize int) map[kvroute.WorkerKey][]kvroute.SeqHash {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: blockSize})
	out := make(map[kvroute.WorkerKey][]kvroute.SeqHash)
	for _, w := range d.FinalState {
		type blk struct {
			parent *string
			tokens []uint32
		}
		byHash := make(map[string]blk)
		for _, b := range w.Blocks {
			byHash[b.BlockHash] = blk{b.Parent, b.TokenIDs}
		}
		memo := make(map[string]kvroute.SeqHash)
		var seqOf func(string) kvroute.SeqHash
		seqOf = func(k string) kvroute.SeqHash {
			if s, ok := memo[k]; ok {
				return s
			}
			b, ok := byHash[k]
			require.True(t, ok, "block %s has no parent in the final state", k)
			local := h.HashBlock(b.tokens)
			s := kvroute.SeqHash(local)
			if b.parent != nil {
				s = kvroute.NextSeqHash(seqOf(*b.parent), local)
			}
			memo[k] = s
			return s
		}
		key := kvroute.WorkerKey{ID: id, Rank: kvroute.DPRank(w.DPRank)}
		out[key] = []kvroute.SeqHash{}
		for _, b := range w.Blocks {
			out[key] = append(out[key], seqOf(b.BlockHash))
		}
		slices.Sort(out[key])
	}
	return out
}

func sortedBlocks(ix *indexer.Index, w kvroute.WorkerKey) []kvroute.SeqHash {
	got := ix.AppendWorkerBlocks(w, []kvroute.SeqHash{})
	slices.Sort(got)
	return got
}

// TestInteropPythonPublisher runs the reference publisher (vLLM's framing,
// deliberate drops, a replay ROUTER) and checks that after replay the index
// holds exactly what the publisher says its workers cache.
func TestInteropPythonPublisher(t *testing.T) {
	requireExternal(t)
	scenarios := []struct {
		name string
		args []string
	}{
		{"layout=map/hash=int/workers=2", []string{"--layout", "map", "--hash-type", "int", "--workers", "2",
			"--clear-every", "37", "--drop-rate", "0.1", "--seed", "7"}},
		{"layout=array/hash=bytes/topicframe", []string{"--layout", "array", "--hash-type", "bytes",
			"--replay-topic-frame", "--drop-rate", "0.15", "--seed", "11", "--medium", "CPU"}},
		{"layout=sglang/dp=3", []string{"--layout", "sglang", "--dp-rank", "3", "--drop-seqs", "0,5,6,7,149",
			"--seed", "3", "--topic", ""}},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			workers := 1
			for i, a := range sc.args {
				if a == "--workers" {
					workers, _ = strconv.Atoi(sc.args[i+1])
				}
			}
			pubPort := freePorts(t, workers)
			replayPort := freePorts(t, workers)
			dir := t.TempDir()
			dumpPath := filepath.Join(dir, "sent.json")
			args := append([]string{publisher,
				"--endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", pubPort),
				"--replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", replayPort),
				"--count", "150", "--interval", "0.001", "--start-delay", "0.7", "--linger", "20",
				"--max-runtime", "40", "--quiet", "--dump", dumpPath}, sc.args...)
			topic := "kv-events"
			for i, a := range args {
				if a == "--topic" {
					topic = args[i+1]
				}
			}

			// The expectation, computed up front with --dry-run.
			out, err := exec.Command(python, append(args, "--dry-run")...).CombinedOutput()
			require.NoError(t, err, string(out))
			raw, err := os.ReadFile(dumpPath)
			require.NoError(t, err)
			var dump publisherDump
			require.NoError(t, json.Unmarshal(raw, &dump))
			dropped := 0
			for _, b := range dump.Batches {
				if b.Dropped {
					dropped++
				}
			}
			require.Positive(t, dropped, "the scenario must drop batches")
			const workerID = 42
			want := expectedBlocks(t, &dump, workerID, 16)
			require.Len(t, want, workers)

			ix, err := indexer.New(indexer.Config{})
			require.NoError(t, err)
			var mu sync.Mutex // makes the convergence check see whole batches
			sink := lockedSink{mu: &mu, ix: ix}
			ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			var subs []*kvzmq.Subscriber
			for i := range workers {
				sub, err := kvzmq.New(kvzmq.Config{
					Endpoint:       fmt.Sprintf("tcp://127.0.0.1:%d", pubPort+i),
					ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", replayPort+i),
					Topic:          topic,
					Converter:      kvevents.ConverterConfig{Worker: workerID, BlockSize: 16},
					Sink:           sink,
					IdleTimeout:    400 * time.Millisecond,
					ReplayTimeout:  time.Second,
					MaxBackoff:     200 * time.Millisecond,
				})
				require.NoError(t, err)
				subs = append(subs, sub)
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = sub.Run(ctx)
				}()
			}
			pub := exec.CommandContext(ctx, python, args...)
			pub.Stdout, pub.Stderr = os.Stdout, os.Stderr
			require.NoError(t, pub.Start())
			defer func() {
				_ = pub.Process.Kill()
				_ = pub.Wait()
			}()

			converged := func() bool {
				mu.Lock()
				defer mu.Unlock()
				for w, blocks := range want {
					if !slices.Equal(blocks, sortedBlocks(ix, w)) {
						return false
					}
				}
				return true
			}
			for !converged() {
				select {
				case <-ctx.Done():
					for w, blocks := range want {
						t.Logf("worker %s: want %d blocks, have %d", w, len(blocks), len(sortedBlocks(ix, w)))
					}
					for i, s := range subs {
						t.Logf("subscriber %d: %+v", i, s.Stats())
					}
					t.Fatal("index did not converge to the publisher's final state")
				case <-time.After(50 * time.Millisecond):
				}
			}
			var total kvzmq.Stats
			for _, s := range subs {
				st := s.Stats()
				total.Gaps += st.Gaps
				total.Replayed += st.Replayed
				total.Malformed += st.Malformed
				total.ApplyErrs += st.ApplyErrs
			}
			require.Positive(t, total.Gaps)
			require.Positive(t, total.Replayed)
			require.Zero(t, total.Malformed)
			require.Zero(t, total.ApplyErrs)
			cancel()
			wg.Wait()
		})
	}
}

type lockedSink struct {
	mu *sync.Mutex
	ix *indexer.Index
}

func (s lockedSink) Apply(ev *kvroute.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ix.Apply(ev)
}

func (s lockedSink) ResetWorker(w kvroute.WorkerKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ix.ResetWorker(w)
}
