package dynamo_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/dynamo"
	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/internal/etcdtest"
	kvdynamo "github.com/kvroute/kvroute/kvevents/dynamo"
	"github.com/kvroute/kvroute/router"
)

// latest is a Sink that keeps the last deployment.
type latest struct {
	mu sync.Mutex
	d  dynamo.Deployment
	n  int
}

func (l *latest) Sync(_ context.Context, d dynamo.Deployment) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.d, l.n = d, l.n+1
}

// ids returns the last deployment's worker ids.
func (l *latest) ids() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []uint64
	for _, w := range l.d.Workers {
		out = append(out, w.InstanceID)
	}
	return out
}

// renamer rewrites the golden worker's ids (instance and publishers) in
// keys and values, in decimal and hex, to make another worker.
func renamer(t *testing.T, files []goldenFile, delta uint64) (*strings.Replacer, uint64) {
	t.Helper()
	var pairs []string
	var id uint64
	add := func(v uint64) {
		pairs = append(pairs, strconv.FormatUint(v, 10), strconv.FormatUint(v+delta, 10),
			strconv.FormatUint(v, 16), strconv.FormatUint(v+delta, 16))
	}
	for _, f := range files {
		switch {
		case f.rec.Model != nil:
			id = f.rec.Model.InstanceID
			add(id)
		case f.rec.Channel != nil:
			add(f.rec.Channel.PublisherID)
		}
	}
	return strings.NewReplacer(pairs...), id + delta
}

// writeWorker writes a copy of the golden worker with its ids moved by
// delta into the store at dir and returns the new instance id and the
// paths written.
func writeWorker(t *testing.T, dir string, delta uint64) (uint64, []string) {
	t.Helper()
	files := goldenFiles(t)
	r, id := renamer(t, files, delta)
	var paths []string
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.bucket), r.Replace(f.name))
		require.NoError(t, os.WriteFile(p, []byte(r.Replace(string(f.value))), 0o644))
		paths = append(paths, p)
	}
	return id, paths
}

func TestFileWatcher(t *testing.T) {
	for _, poll := range []bool{false, true} {
		t.Run(fmt.Sprintf("poll=%v", poll), func(t *testing.T) { testFileWatcher(t, poll) })
	}
}

func testFileWatcher(t *testing.T, poll bool) {
	dir := copyStore(t)
	files := goldenFiles(t)
	_, first := renamer(t, files, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink := &latest{}
	w := &dynamo.FileWatcher{Dir: dir, TTL: 3 * time.Second, Resync: 50 * time.Millisecond, Poll: poll}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, sink) }()
	require.Eventually(t, func() bool { return slicesEqual(sink.ids(), first) }, 5*time.Second, 5*time.Millisecond)

	// A card rewritten in place (same size, same inode) is read again.
	for _, f := range files {
		if f.rec.Model != nil {
			v := strings.Replace(string(f.value), `"total_kv_blocks":800`, `"total_kv_blocks":900`, 1)
			require.NotEqual(t, string(f.value), v)
			require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.FromSlash(f.bucket), f.name), []byte(v), 0o644))
		}
	}
	require.Eventually(t, func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return len(sink.d.Workers) == 1 && sink.d.Workers[0].KVBlocks == 900
	}, 5*time.Second, 5*time.Millisecond)

	// A second worker appears.
	second, paths := writeWorker(t, dir, 1)
	require.Eventually(t, func() bool { return slicesEqual(sink.ids(), first, second) }, 5*time.Second, 5*time.Millisecond)

	// Half-written files and invalid values are left out; the others stay.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "v1", "instances", ".tmp_0123"), []byte("{"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "v1", "mdc", "x%2Fy%2Fz%2F5"), []byte(`{"type":"Model"}`), 0o644))
	n := sink.n
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, n, sink.n, "nothing changed, no sync")
	require.True(t, slicesEqual(sink.ids(), first, second))

	// The second stops cleanly: its files go.
	for _, p := range paths {
		require.NoError(t, os.Remove(p))
	}
	require.Eventually(t, func() bool { return slicesEqual(sink.ids(), first) }, 5*time.Second, 5*time.Millisecond)

	// A third dies: nobody touches its files any more and they age out
	// while the first worker's writer keeps touching its own.
	third, paths := writeWorker(t, dir, 2)
	require.Eventually(t, func() bool { return slicesEqual(sink.ids(), first, third) }, 5*time.Second, 5*time.Millisecond)
	touch := time.NewTicker(500 * time.Millisecond)
	defer touch.Stop()
	start := time.Now()
	for !slicesEqual(sink.ids(), first) {
		require.Less(t, time.Since(start), 10*time.Second, "the dead worker did not age out")
		<-touch.C
		now := time.Now()
		for _, f := range files {
			_ = os.Chtimes(filepath.Join(dir, filepath.FromSlash(f.bucket), f.name), now, now)
		}
	}
	require.Greater(t, time.Since(start), 2*time.Second, "aged out before the TTL")

	// A whole bucket removed and created again is watched again.
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "v1", "mdc")))
	require.Eventually(t, func() bool { return len(sink.ids()) == 0 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "v1", "mdc"), 0o755))
	_, _ = writeWorker(t, dir, 0)
	require.Eventually(t, func() bool { return slicesEqual(sink.ids(), first) }, 5*time.Second, 5*time.Millisecond)
	_ = paths

	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

func TestFileWatcherConfig(t *testing.T) {
	require.ErrorIs(t, (&dynamo.FileWatcher{}).Run(context.Background(), &latest{}), dynamo.ErrConfig)
	require.ErrorIs(t, (&dynamo.FileWatcher{Dir: "x"}).Run(context.Background(), nil), dynamo.ErrConfig)
	require.ErrorIs(t, (&dynamo.EtcdWatcher{}).Run(context.Background(), &latest{}), dynamo.ErrConfig)
}

// A store directory that does not exist yet is waited for.
func TestFileWatcherLateStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kv")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink := &latest{}
	go func() { _ = (&dynamo.FileWatcher{Dir: dir, Resync: 50 * time.Millisecond}).Run(ctx, sink) }()
	time.Sleep(100 * time.Millisecond)
	require.Empty(t, sink.ids())
	require.NoError(t, os.CopyFS(dir, os.DirFS(copyStore(t))))
	_, first := renamer(t, goldenFiles(t), 0)
	require.Eventually(t, func() bool { return slicesEqual(sink.ids(), first) }, 5*time.Second, 5*time.Millisecond)
}

func slicesEqual(got []uint64, want ...uint64) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// The golden worker registers with a Pool: its instance id is the router's
// worker id; a router hashing other block sizes refuses it.
func TestPoolSinkEngines(t *testing.T) {
	d := goldenState(t, "file").Deployment(dynamo.Selector{})
	require.Len(t, d.Workers, 1)
	w := d.Workers[0]
	e := w.Engine()
	require.Equal(t, kvroute.WorkerID(w.InstanceID), e.ID)
	require.Equal(t, "dynamo/backend/generate/"+strconv.FormatUint(w.InstanceID, 16), e.Name)
	require.NotNil(t, w.KVEvents[0].Recovery)
	require.Equal(t, []discovery.DynamoPublisher{{Endpoint: w.KVEvents[0].Endpoints[0], Rank: 0, Recovery: w.KVEvents[0].Recovery.Address}}, e.DynamoEvents)
	require.NoError(t, e.Validate())

	for _, tc := range []struct {
		block int
		want  error
	}{{16, nil}, {32, enginemetrics.ErrBlockSize}} {
		r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: tc.block})})
		require.NoError(t, err)
		var started, stopped sync.WaitGroup
		started.Add(1)
		pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, RetryInterval: -1,
			DynamoEvents: func(e *discovery.Engine, p discovery.DynamoPublisher) (discovery.EventRunner, error) {
				return runnerFunc(func(ctx context.Context) error {
					started.Done()
					stopped.Add(1)
					defer stopped.Done()
					<-ctx.Done()
					require.NotEmpty(t, r.Workers(), "stopped before RemoveWorker")
					return ctx.Err()
				}), nil
			}})
		require.NoError(t, err)
		dynamo.PoolSink(pool, nil).Sync(context.Background(), d)
		if tc.want != nil {
			require.ErrorIs(t, pool.Rejected()[e.Name], tc.want)
			require.Empty(t, r.Workers())
			require.NoError(t, pool.Close())
			continue
		}
		started.Wait()
		require.Equal(t, []kvroute.WorkerKey{{ID: e.ID}}, r.Workers())
		st := r.Stats()
		require.Len(t, st.Workers, 1)
		dynamo.PoolSink(pool, nil).Sync(context.Background(), dynamo.Deployment{})
		stopped.Wait()
		require.Empty(t, r.Workers())
		require.NoError(t, pool.Close())
	}
}

type runnerFunc func(ctx context.Context) error

func (f runnerFunc) Run(ctx context.Context) error { return f(ctx) }

func TestEtcdWatcher(t *testing.T) {
	c, _ := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	recs := goldenEtcd(t)
	// putWorker writes the golden keys (ids moved by delta) under one
	// lease, as Dynamo does.
	putWorker := func(delta uint64) (uint64, clientv3.LeaseID) {
		var id uint64
		var pairs []string
		for _, r := range recs {
			rec, err := dynamo.Decode(r.Value)
			require.NoError(t, err)
			var v uint64
			switch {
			case rec.Model != nil:
				v, id = rec.Model.InstanceID, rec.Model.InstanceID+delta
			case rec.Channel != nil:
				v = rec.Channel.PublisherID
			default:
				continue
			}
			pairs = append(pairs, strconv.FormatUint(v, 10), strconv.FormatUint(v+delta, 10),
				strconv.FormatUint(v, 16), strconv.FormatUint(v+delta, 16))
		}
		rp := strings.NewReplacer(pairs...)
		lease, err := c.Grant(ctx, 60)
		require.NoError(t, err)
		for _, r := range recs {
			_, err := c.Put(ctx, "/dyn/"+rp.Replace(r.Key), rp.Replace(string(r.Value)), clientv3.WithLease(lease.ID))
			require.NoError(t, err)
		}
		return id, lease.ID
	}
	first, _ := putWorker(0)
	sink := &latest{}
	done := make(chan error, 1)
	go func() {
		done <- (&dynamo.EtcdWatcher{Client: c, Prefix: "/dyn/", Backoff: 50 * time.Millisecond}).Run(ctx, sink)
	}()
	require.Eventually(t, func() bool { return slicesEqual(sink.ids(), first) }, 10*time.Second, 5*time.Millisecond)
	sink.mu.Lock()
	require.Len(t, sink.d.Workers[0].Metrics, 2)
	sink.mu.Unlock()

	second, lease := putWorker(1)
	require.Eventually(t, func() bool { return slicesEqual(sink.ids(), first, second) }, 10*time.Second, 5*time.Millisecond)

	// An invalid value is left out, the rest stays; its lease ending
	// takes the worker away.
	_, err := c.Put(ctx, "/dyn/v1/mdc/x/y/z/1", "{")
	require.NoError(t, err)
	_, err = c.Revoke(ctx, lease)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return slicesEqual(sink.ids(), first) }, 10*time.Second, 5*time.Millisecond)

	// After a compaction past the watch's revision the watcher lists
	// again and still follows.
	resp, err := c.Get(ctx, "x")
	require.NoError(t, err)
	_, err = c.Compact(ctx, resp.Header.Revision)
	require.NoError(t, err)
	third, _ := putWorker(2)
	require.Eventually(t, func() bool { return slicesEqual(sink.ids(), first, third) }, 10*time.Second, 5*time.Millisecond)

	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

// PoolSink has a real event-plane subscriber follow the golden worker's
// kv-events publisher (through the pool) and the deployment's load
// channels, each with the card's capacity and limits, and drops them all
// when the worker goes.
func TestPoolSinkSubscriber(t *testing.T) {
	for _, backend := range []string{"file", "etcd"} {
		t.Run(backend, func(t *testing.T) {
			d := goldenState(t, backend).Deployment(dynamo.Selector{})
			require.Len(t, d.Workers, 1)
			w := d.Workers[0]
			r, sub, sink := syncedPool(t, d)
			want := map[string]kvdynamo.Publisher{}
			limits := kvdynamo.Publisher{KVCapacityBlocks: 800, BlockSize: 16, MaxRequests: w.MaxRequests, MaxBatchedTokens: w.MaxBatchedTokens}
			require.Positive(t, limits.MaxRequests)
			require.Positive(t, limits.MaxBatchedTokens)
			for _, c := range append([]dynamo.Channel{{Topic: dynamo.TopicKVEvents, Endpoints: w.KVEvents[0].Endpoints}}, d.Metrics...) {
				p := limits
				p.Endpoint, p.Topic = c.Endpoints[0], c.Topic
				want[p.Topic] = p
			}
			// The kv-events publisher recovers from the worker's KV query
			// endpoint, the one its event source names.
			rt, err := kvdynamo.ParseRecoveryTarget(w.KVEvents[0].Recovery.Address, w.InstanceID, 0)
			require.NoError(t, err)
			require.Contains(t, rt.Path, "worker_kv_query_source")
			kv := want[dynamo.TopicKVEvents]
			kv.Recovery = &rt
			want[dynamo.TopicKVEvents] = kv
			require.Eventually(t, func() bool {
				got := map[string]kvdynamo.Publisher{}
				for _, p := range sub.Publishers() {
					got[p.Topic] = p
				}
				return reflect.DeepEqual(want, got)
			}, 5*time.Second, 5*time.Millisecond)
			require.Equal(t, []kvroute.WorkerKey{{ID: kvroute.WorkerID(w.InstanceID)}}, r.Workers())

			sink.Sync(context.Background(), dynamo.Deployment{})
			require.Empty(t, r.Workers())
			require.Empty(t, sub.Publishers())
		})
	}
}

// Two workers on the NATS event plane (the golden worker and a copy, their
// channels moved to NATS as Dynamo records them with --event-plane nats)
// share each subject: it is followed once.
func TestNATSChannels(t *testing.T) {
	files := goldenFiles(t)
	var st dynamo.State
	for delta := range uint64(2) {
		r, _ := renamer(t, files, delta)
		for _, f := range files {
			v := r.Replace(string(f.value))
			if f.rec.Channel != nil {
				v = strings.Replace(v, `{"kind":"Zmq","config":{"endpoint":"`+f.rec.Channel.Endpoints[0]+`"}}`,
					`{"kind":"Nats","config":{"subject_prefix":"namespace.dynamo.component.backend.endpoint.generate"}}`, 1)
				require.NotEqual(t, r.Replace(string(f.value)), v)
			}
			require.NoError(t, st.Put(r.Replace(f.key), []byte(v), 0))
		}
	}
	d := st.Deployment(dynamo.Selector{})
	require.Len(t, d.Workers, 2)
	require.Empty(t, dynamo.Engines(d)[0].DynamoEvents, "NATS publishers are not the Pool's")
	var subjects []string
	for _, ch := range dynamo.NATSChannels(d) {
		subjects = append(subjects, ch.Subject)
		require.Equal(t, 800, ch.KVCapacityBlocks)
		require.Equal(t, 16, ch.BlockSize)
	}
	prefix := "namespace.dynamo.component.backend.endpoint.generate."
	require.Equal(t, []string{prefix + dynamo.TopicForwardPassMetrics, prefix + dynamo.TopicKVEvents, prefix + dynamo.TopicKVMetrics}, subjects)
	require.Empty(t, dynamo.NATSChannels(goldenState(t, "file").Deployment(dynamo.Selector{})), "ZMQ channels are not NATS ones")
}

// syncedPool is a router, a Dynamo event subscriber into its index, and a
// discovery pool over both with its PoolSink, synced once with d; the
// pool is closed when the test ends.
func syncedPool(t *testing.T, d dynamo.Deployment) (*router.Router, *kvdynamo.Subscriber, dynamo.Sink) {
	t.Helper()
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	require.NoError(t, err)
	sub, err := kvdynamo.New(kvdynamo.Config{Sink: r.Index(), Load: r})
	require.NoError(t, err)
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, DynamoEvents: dynamo.KVEvents(sub), RetryInterval: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pool.Close() })
	sink := dynamo.PoolSink(pool, sub)
	sink.Sync(context.Background(), d)
	return r, sub, sink
}

// counts is a Sink that records how many workers each sync had.
type counts struct {
	mu sync.Mutex
	n  []int
}

func (c *counts) Sync(_ context.Context, d dynamo.Deployment) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n = append(c.n, len(d.Workers))
}

func (c *counts) snapshot() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.n...)
}

// A bucket that cannot be listed for a while (here it is a file, not a
// directory) leaves the store's state unknown, not empty: the workers
// stay until a listing succeeds. A missing bucket is an empty one, so the
// bucket must never be missing while the test swaps it: it is a symbolic
// link, to the real directory and then to a file, each replaced in one
// rename, which no listing can fall between.
func TestFileWatcherKeepsDeploymentWhileUnreadable(t *testing.T) {
	dir := copyStore(t)
	bucket := filepath.Join(dir, "v1", "instances")
	real := filepath.Join(dir, "instances.real")
	require.NoError(t, os.Rename(bucket, real))
	notDir := filepath.Join(dir, "not-a-directory")
	require.NoError(t, os.WriteFile(notDir, []byte("not a directory"), 0o644))
	// pointAt makes bucket a link to target in one rename.
	pointAt := func(target string) {
		t.Helper()
		link := filepath.Join(dir, "instances.link")
		require.NoError(t, os.Symlink(target, link))
		require.NoError(t, os.Rename(link, bucket))
	}
	pointAt(real)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sink := &counts{}
	w := &dynamo.FileWatcher{Dir: dir, TTL: -1, Resync: 20 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, sink) }()
	require.Eventually(t, func() bool { c := sink.snapshot(); return len(c) > 0 && c[len(c)-1] == 1 }, 5*time.Second, 5*time.Millisecond)

	pointAt(notDir)
	time.Sleep(200 * time.Millisecond) // ten listings
	pointAt(real)
	time.Sleep(100 * time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.NotContains(t, sink.snapshot(), 0, "the worker was dropped while its bucket could not be listed")
}

// Two workers may share a kv-events endpoint for a while (an engine
// restarted on its predecessor's port before the old keys expire): when
// the old worker goes, the new one's events are still followed.
func TestKVEventsSharedEndpoint(t *testing.T) {
	files := goldenFiles(t)
	state := func(deltas ...uint64) dynamo.Deployment {
		var st dynamo.State
		for _, delta := range deltas {
			r, _ := renamer(t, files, delta) // new ids, the same endpoints
			for _, f := range files {
				require.NoError(t, st.Put(r.Replace(f.key), []byte(r.Replace(string(f.value))), 0))
			}
		}
		return st.Deployment(dynamo.Selector{})
	}
	both := state(0, 1)
	require.Len(t, both.Workers, 2)
	endpoint := both.Workers[0].KVEvents[0].Endpoints[0]
	require.Equal(t, endpoint, both.Workers[1].KVEvents[0].Endpoints[0])
	_, newID := renamer(t, files, 1)
	r, sub, sink := syncedPool(t, both)
	follows := func() bool {
		for _, p := range sub.Publishers() {
			if p.Endpoint == endpoint && p.Topic == kvdynamo.TopicKVEvents {
				return true
			}
		}
		return false
	}
	require.Eventually(t, follows, 5*time.Second, 5*time.Millisecond)

	sink.Sync(context.Background(), state(1)) // the old worker's keys expire
	require.Equal(t, []kvroute.WorkerKey{{ID: kvroute.WorkerID(newID)}}, r.Workers())
	require.Never(t, func() bool { return !follows() }, 300*time.Millisecond, 5*time.Millisecond,
		"the registered worker's kv-events publisher %s is no longer followed", endpoint)

	sink.Sync(context.Background(), state()) // and then the new one's
	require.Eventually(t, func() bool { return !follows() }, 5*time.Second, 5*time.Millisecond)
}
