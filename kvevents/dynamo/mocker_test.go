package dynamo_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/internal/dynamotest"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/dynamo"
	kvzmq "github.com/kvroute/kvroute/kvevents/zmq"
)

// storeRecords reads Dynamo's file discovery store: the event channels
// (endpoint by topic) and the kv-events source (worker, recovery target).
func storeRecords(t *testing.T, store string) (map[string]string, *dynamo.RecoveryTarget) {
	t.Helper()
	r := &relay{dir: store}
	chans := r.channels(t)
	tgt, ok := r.recoveryTarget(t)
	if !ok {
		return chans, nil
	}
	return chans, &tgt
}

// indexContent lists what an index holds, block by block, sorted.
func indexContent(t *testing.T, ix *indexer.Index) []string {
	var out []string
	require.NoError(t, ix.Dump(func(ev *kvroute.Event) error {
		for _, b := range ev.Blocks {
			out = append(out, fmt.Sprintf("%s ext=%d hash=%d parent=%v/%d", ev.Worker, b.External, b.Hash, ev.HasParent, ev.Parent))
		}
		return nil
	}))
	slices.Sort(out)
	return out
}

// TestLiveMocker runs a Dynamo mocker worker (its simulated vLLM engine
// keeps a real prefix cache) and Dynamo's frontend, sends chats that share
// system prompts, and indexes the worker's KV events twice: from its
// vLLM-format port (kvevents/zmq, kvroute hashing the tokens) and from its
// event plane (Subscriber, with recovery from the worker's local indexer).
// Both indexes must hold the same blocks; the worker's forward-pass and KV
// metrics must arrive as heartbeats.
func TestLiveMocker(t *testing.T) {
	dynamotest.Python(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	store, model := t.TempDir(), t.TempDir()
	dynamotest.WriteModel(t, model)
	vllmPort, replayPort, httpPort := dynamotest.FreePort(t), dynamotest.FreePort(t), dynamotest.FreePort(t)
	mocker := dynamotest.Start(t, store, "dynamo.mocker", "--model-path", model, "--model-name", "tiny",
		"--block-size", "16", "--num-gpu-blocks-override", "800", "--discovery-backend", "file",
		"--request-plane", "tcp", "--event-plane", "zmq", "--speedup-ratio", "10",
		"--zmq-kv-events-ports", strconv.Itoa(vllmPort), "--zmq-replay-ports", strconv.Itoa(replayPort))
	frontend := dynamotest.Start(t, store, "dynamo.frontend", "--http-port", strconv.Itoa(httpPort),
		"--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq", "--router-mode", "round-robin")
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	waitFor(t, ctx, "the frontend to serve the model", func() bool { return dynamotest.Serves(ctx, base, "tiny") }, nil)
	var chans map[string]string
	var tgt *dynamo.RecoveryTarget
	waitFor(t, ctx, "the worker's event channels and source", func() bool {
		chans, tgt = storeRecords(t, store)
		return tgt != nil && chans[dynamo.TopicKVEvents] != "" && chans[dynamo.TopicKVMetrics] != "" &&
			chans[dynamo.TopicForwardPassMetrics] != ""
	}, nil)
	defer func() {
		if t.Failed() {
			t.Logf("mocker:\n%s\nfrontend:\n%s", mocker.Tail(), frontend.Tail())
		}
	}()
	worker := kvroute.WorkerID(tgt.WorkerID)

	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})
	direct, err := indexer.New(indexer.Config{Hasher: h})
	require.NoError(t, err)
	viaDynamo, err := indexer.New(indexer.Config{Hasher: h})
	require.NoError(t, err)
	zsub, err := kvzmq.New(kvzmq.Config{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", vllmPort),
		ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", replayPort), Sink: direct,
		Converter: kvevents.ConverterConfig{Worker: worker, BlockSize: 16}})
	require.NoError(t, err)
	loads := &loadLog{}
	sub, err := dynamo.New(dynamo.Config{Sink: viaDynamo, Load: loads})
	require.NoError(t, err)
	require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: chans[dynamo.TopicKVEvents], Topic: dynamo.TopicKVEvents, Recovery: tgt}))
	for _, topic := range []string{dynamo.TopicKVMetrics, dynamo.TopicForwardPassMetrics} {
		require.NoError(t, sub.AddPublisher(dynamo.Publisher{Endpoint: chans[topic], Topic: topic,
			KVCapacityBlocks: 800, BlockSize: 16, MaxRequests: 256, MaxBatchedTokens: 8192}))
	}
	r := &liveRun{t: t, ctx: ctx}
	r.run(zsub.Run)
	r.run(sub.Run)

	// Chats sharing two system prompts; each request's blocks reach both
	// paths (the vLLM-format one replays what it missed while joining, the
	// event plane restores from the worker's local indexer).
	systems := []string{
		"You are a careful assistant for a weather service. Answer with precise figures, units and sources, and never guess.",
		"You are a terse assistant for a railway company. Give timetables and platform numbers only, no small talk at all.",
	}
	for i := range 6 {
		body, err := json.Marshal(map[string]any{"model": "tiny", "max_tokens": 8, "messages": []map[string]string{
			{"role": "system", "content": systems[i%2]},
			{"role": "user", "content": fmt.Sprintf("Question number %d: what should I expect tomorrow morning around nine?", i)},
		}})
		require.NoError(t, err)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("content-type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	var a, b []string
	waitFor(t, ctx, "both indexes to hold the same blocks", func() bool {
		a, b = indexContent(t, direct), indexContent(t, viaDynamo)
		return len(a) > 0 && slices.Equal(a, b)
	}, nil)
	t.Logf("%d blocks in both indexes", len(a))

	// A subscriber started now, while the worker is idle, holds the same
	// blocks as soon as the publisher is added: it asks the worker for a
	// dump then, without waiting for an event.
	lateIx, err := indexer.New(indexer.Config{Hasher: h})
	require.NoError(t, err)
	late, err := dynamo.New(dynamo.Config{Sink: lateIx})
	require.NoError(t, err)
	require.NoError(t, late.AddPublisher(dynamo.Publisher{Endpoint: chans[dynamo.TopicKVEvents], Topic: dynamo.TopicKVEvents, Recovery: tgt}))
	r.run(late.Run)
	var c []string
	waitFor(t, ctx, "the late subscriber to hold the idle worker's blocks", func() bool {
		c = indexContent(t, lateIx)
		return slices.Equal(a, c)
	}, nil)
	lst := late.Stats()
	t.Logf("late subscriber: %+v", lst)
	require.Equal(t, uint64(1), lst.Restored)
	require.Equal(t, lst.Applied, lst.Recovered, "every block from the dump, none from a live event")

	w := kvroute.WorkerKey{ID: worker}
	waitFor(t, ctx, "a forward-pass heartbeat", func() bool {
		l, ok := loads.get(w)
		return ok && l.KVCapacityBlocks == 800 && l.MaxRequests == 256
	}, nil)
	st := sub.Stats()
	t.Logf("subscriber: %+v", st)
	require.Zero(t, st.Malformed)
	require.Zero(t, st.ApplyErrs)
	require.NotZero(t, st.LoadReports)
}
