package dynamo_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/dynamo"
	"github.com/kvroute/kvroute/internal/dynamotest"
	"github.com/kvroute/kvroute/internal/etcdtest"
	kvdynamo "github.com/kvroute/kvroute/kvevents/dynamo"
	"github.com/kvroute/kvroute/router"
)

// liveRouter is a router fed by discovery: a Pool whose workers' kv-events
// and the deployment's load channels go through a real kvevents/dynamo
// subscriber.
type liveRouter struct {
	r    *router.Router
	sub  *kvdynamo.Subscriber
	pool *discovery.Pool
	sink dynamo.Sink
}

func newLiveRouter(t *testing.T, ctx context.Context) *liveRouter {
	t.Helper()
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	require.NoError(t, err)
	sub, err := kvdynamo.New(kvdynamo.Config{Sink: r.Index(), Load: r})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sub.Run(ctx)
	}()
	t.Cleanup(func() { <-done })
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, DynamoEvents: dynamo.KVEvents(sub)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pool.Close() })
	return &liveRouter{r: r, sub: sub, pool: pool, sink: dynamo.PoolSink(pool, sub)}
}

// workers returns the router's worker ids.
func (l *liveRouter) workers() []uint64 {
	var out []uint64
	for _, k := range l.r.Workers() {
		out = append(out, uint64(k.ID))
	}
	slices.Sort(out)
	return out
}

// reported reports whether the router has a load report for worker id
// with the mocker's KV capacity: the worker's load channels were found
// and followed.
func (l *liveRouter) reported(id uint64) bool {
	for _, w := range l.r.Stats().Workers {
		if uint64(w.Worker.ID) == id && w.Reported.KVCapacityBlocks == 800 {
			return true
		}
	}
	return false
}

// following returns the topics the subscriber follows.
func (l *liveRouter) following() []string {
	var out []string
	for _, p := range l.sub.Publishers() {
		out = append(out, p.Topic)
	}
	slices.Sort(out)
	return out
}

// instanceIDs reads the instance ids of the "generate" endpoints a file
// store holds, from its file names.
func instanceIDs(t *testing.T, store string) []uint64 {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(store, "v1", "instances"))
	var out []uint64
	for _, e := range ents {
		key, err := dynamo.FileKey(dynamo.BucketInstances, e.Name())
		require.NoError(t, err)
		parts := strings.Split(key, "/")
		if parts[len(parts)-2] == "generate" {
			id, err := strconv.ParseUint(parts[len(parts)-1], 16, 64)
			require.NoError(t, err)
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Real mocker workers come and go in a file store: the router follows,
// with each worker's kv-events publisher and load channels subscribed.
func TestLiveFileStore(t *testing.T) {
	dynamotest.Python(t)
	model := filepath.Join(t.TempDir(), "model")
	dynamotest.WriteModel(t, model)
	store := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := newLiveRouter(t, ctx)
	w := &dynamo.FileWatcher{Dir: store, Selector: dynamo.Selector{Namespace: "dynamo", Model: "tiny"}, TTL: 5 * time.Second,
		Resync: 200 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, l.sink) }()

	a := startMocker(t, model, dynEnv{backend: "file", store: store})
	waitFor(t, a, "worker a registered", func() bool { ids := instanceIDs(t, store); return len(ids) == 1 && slices.Equal(l.workers(), ids) })
	idA := l.workers()[0]
	waitFor(t, a, "worker a's load reported", func() bool { return l.reported(idA) })
	require.Equal(t, []string{dynamo.TopicForwardPassMetrics, dynamo.TopicKVEvents, dynamo.TopicKVMetrics}, l.following())
	m := l.pool.Members()
	require.Len(t, m, 1)
	require.Equal(t, kvroute.WorkerID(idA), m[0].ID)
	require.Len(t, m[0].DynamoEvents, 1)
	require.True(t, strings.HasPrefix(m[0].DynamoEvents[0].Endpoint, "tcp://127.0.0.1:"), m[0].DynamoEvents[0].Endpoint)
	require.True(t, strings.HasPrefix(m[0].DynamoEvents[0].Recovery, "127.0.0.1:"), m[0].DynamoEvents[0].Recovery)

	// Requests through Dynamo's own frontend make the worker cache blocks;
	// its kv-events reach the router's index under its instance id.
	port := dynamotest.FreePort(t)
	fe := startFrontend(t, dynEnv{backend: "file", store: store}, port)
	chat(t, fe, port, "the router keeps the cache warm for every worker. ")
	waitFor(t, a, "worker a's blocks indexed", func() bool {
		return len(l.r.Index().AppendWorkerBlocks(kvroute.WorkerKey{ID: kvroute.WorkerID(idA)}, nil)) > 0
	})
	require.Positive(t, l.sub.Stats().AppliedStored)

	// A router started now learns what the worker cached before from its
	// KV query endpoint (the recovery target discovery found) as soon as
	// it registers the worker, which stays idle: no request is sent.
	keyA := kvroute.WorkerKey{ID: kvroute.WorkerID(idA)}
	before := l.r.Index().AppendWorkerBlocks(keyA, nil)
	late := newLiveRouter(t, ctx)
	lateDone := make(chan error, 1)
	go func() {
		lateDone <- (&dynamo.FileWatcher{Dir: store, Resync: 200 * time.Millisecond}).Run(ctx, late.sink)
	}()
	waitFor(t, a, "late router registered worker a", func() bool { return slices.Equal(late.workers(), []uint64{idA}) })
	waitFor(t, a, "late router recovered idle worker a's blocks", func() bool {
		got := late.r.Index().AppendWorkerBlocks(keyA, nil)
		for _, h := range before {
			if !slices.Contains(got, h) {
				return false
			}
		}
		return true
	})
	lst := late.sub.Stats()
	require.Positive(t, lst.Restored, "restored from a dump of the worker's cache")
	require.Equal(t, lst.AppliedStored, lst.Recovered, "every block from the dump, none from a live event: %+v", lst)
	chat(t, fe, port, "a different question about another topic entirely. ")
	fe.Stop(syscall.SIGTERM)

	b := startMocker(t, model, dynEnv{backend: "file", store: store})
	waitFor(t, b, "worker b registered", func() bool { return len(l.workers()) == 2 })
	idB := l.workers()[slices.Index(l.workers(), idA)^1]
	require.Equal(t, instanceIDs(t, store), l.workers())
	waitFor(t, b, "worker b's load reported", func() bool { return l.reported(idB) })
	require.Len(t, l.following(), 6)

	// b stops cleanly: it deletes its files.
	b.Stop(syscall.SIGTERM)
	waitFor(t, a, "worker b removed", func() bool { return slices.Equal(l.workers(), []uint64{idA}) })
	require.Len(t, l.following(), 3)

	// a is killed: its files stay, untouched, until they are TTL old.
	a.Stop(syscall.SIGKILL)
	require.Equal(t, []uint64{idA}, instanceIDs(t, store))
	// Each file ages out on its own, a little apart: the load channels'
	// files may outlive the instance's by a resync or two.
	waitFor(t, a, "worker a and its load channels aged out", func() bool { return len(l.workers()) == 0 && len(l.following()) == 0 })
	require.Equal(t, []uint64{idA}, instanceIDs(t, store), "the watcher never deletes")
	require.Empty(t, l.pool.Members())
	require.Empty(t, l.r.Index().AppendWorkerBlocks(kvroute.WorkerKey{ID: kvroute.WorkerID(idA)}, nil))

	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.ErrorIs(t, <-lateDone, context.Canceled)
}

// A real mocker registers in etcd: the router follows its lease.
func TestLiveEtcdStore(t *testing.T) {
	dynamotest.Python(t)
	c, url := etcdtest.Start(t)
	model := filepath.Join(t.TempDir(), "model")
	dynamotest.WriteModel(t, model)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := newLiveRouter(t, ctx)
	done := make(chan error, 1)
	go func() {
		done <- (&dynamo.EtcdWatcher{Client: c, Selector: dynamo.Selector{Model: "tiny"}}).Run(ctx, l.sink)
	}()
	a := startMocker(t, model, dynEnv{backend: "etcd", store: url})
	waitFor(t, a, "worker registered", func() bool { return len(l.workers()) == 1 })
	id := l.workers()[0]
	waitFor(t, a, "load reported", func() bool { return l.reported(id) })
	require.Equal(t, []string{dynamo.TopicForwardPassMetrics, dynamo.TopicKVEvents, dynamo.TopicKVMetrics}, l.following())
	// Its keys are under its lease, whose id is the instance id.
	resp, err := c.Get(ctx, "v1/", clientv3.WithPrefix())
	require.NoError(t, err)
	require.NotEmpty(t, resp.Kvs)
	for _, kv := range resp.Kvs {
		require.Equal(t, id, uint64(kv.Lease), string(kv.Key))
	}
	// A second worker is killed: its keys stay until its lease expires
	// (Dynamo grants 30 s); its expiry, hastened here, deletes them as a
	// revocation does.
	b := startMocker(t, model, dynEnv{backend: "etcd", store: url})
	waitFor(t, b, "worker b registered", func() bool { return len(l.workers()) == 2 })
	idB := l.workers()[slices.Index(l.workers(), id)^1]
	b.Stop(syscall.SIGKILL)
	ttl, err := c.TimeToLive(ctx, clientv3.LeaseID(idB))
	require.NoError(t, err)
	require.Positive(t, ttl.TTL, "the killed worker's lease is still alive")
	t.Logf("worker lease: granted %d s, %d s left after the kill", ttl.GrantedTTL, ttl.TTL)
	require.Len(t, l.workers(), 2)
	_, err = c.Revoke(ctx, clientv3.LeaseID(idB))
	require.NoError(t, err)
	waitFor(t, a, "worker b's lease ended", func() bool { return slices.Equal(l.workers(), []uint64{id}) })
	require.Len(t, l.following(), 3)

	// a stops cleanly: it revokes its lease at once.
	a.Stop(syscall.SIGTERM)
	waitFor(t, a, "worker removed", func() bool { return len(l.workers()) == 0 })
	require.Empty(t, l.following())
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

// waitFor polls cond for up to a minute (mockers take seconds to start
// on a loaded machine) and fails with the mocker's log.
func waitFor(t *testing.T, m *dynamotest.Process, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: timed out; mocker log:\n%s", what, m.Tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// chat sends one chat completion through the frontend once it lists the
// model, with a prompt of several blocks (text repeated).
func chat(t *testing.T, fe *dynamotest.Process, port int, text string) {
	t.Helper()
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	waitFor(t, fe, "frontend lists the model", func() bool { return dynamotest.Serves(context.Background(), base, "tiny") })
	body, err := json.Marshal(map[string]any{"model": "tiny", "max_tokens": 4, "messages": []map[string]string{
		{"role": "user", "content": strings.Repeat(text, 8)}}})
	require.NoError(t, err)
	// The frontend may list the model a moment before it routes chats to
	// it (it adds the worker set after): a 404 is retried for a while.
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s\nfrontend log:\n%s", b, fe.Tail())
		return
	}
}

// A real mocker on Dynamo's NATS event plane: discovery finds its NATS
// channels and a NATS subscriber follows each subject once; a chat through
// the frontend gets the worker's blocks indexed.
func TestLiveNATSEventPlane(t *testing.T) {
	dynamotest.Python(t)
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	go srv.Start()
	defer srv.Shutdown()
	require.True(t, srv.ReadyForConnections(10*time.Second))
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	defer nc.Close()

	model := filepath.Join(t.TempDir(), "model")
	dynamotest.WriteModel(t, model)
	env := dynEnv{backend: "file", store: t.TempDir(), nats: srv.ClientURL()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	require.NoError(t, err)
	ns, err := kvdynamo.NewNATS(kvdynamo.NATSConfig{Conn: nc, Sink: r.Index(), Load: r})
	require.NoError(t, err)
	nsDone := make(chan struct{})
	go func() {
		defer close(nsDone)
		_ = ns.Run(ctx)
	}()
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r})
	require.NoError(t, err)
	defer pool.Close()
	var deployment latest
	done := make(chan error, 1)
	go func() {
		done <- (&dynamo.FileWatcher{Dir: env.store, Resync: 200 * time.Millisecond}).Run(ctx,
			dynamo.Sinks{dynamo.PoolSink(pool, nil), dynamo.NATSSink(ns), &deployment})
	}()

	a := startMocker(t, model, env)
	waitFor(t, a, "worker registered", func() bool { return len(r.Workers()) == 1 })
	id := r.Workers()[0].ID
	deployment.mu.Lock()
	w := deployment.d.Workers[0]
	deployment.mu.Unlock()
	require.Len(t, w.KVEvents, 1)
	require.Equal(t, "Nats", w.KVEvents[0].Transport)
	require.Equal(t, "namespace.dynamo.component.backend.endpoint.generate", w.KVEvents[0].Endpoints[0])
	waitFor(t, a, "load reported", func() bool {
		for _, s := range r.Stats().Workers {
			if s.Worker.ID == id && s.Reported.KVCapacityBlocks == 800 {
				return true
			}
		}
		return false
	})
	port := dynamotest.FreePort(t)
	fe := startFrontend(t, env, port)
	chat(t, fe, port, "the router keeps the cache warm for every worker. ")
	waitFor(t, a, "blocks indexed", func() bool { return len(r.Index().AppendWorkerBlocks(kvroute.WorkerKey{ID: id}, nil)) > 0 })
	fe.Stop(syscall.SIGTERM)
	a.Stop(syscall.SIGTERM)
	waitFor(t, a, "worker removed", func() bool { return len(r.Workers()) == 0 })
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	<-nsDone
}
