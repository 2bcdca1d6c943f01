package dynamo_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/dynamo"
	"github.com/kvroute/kvroute/router"
)

// goldenFile is one file of testdata/filestore.
type goldenFile struct {
	bucket, name, key string
	value             []byte
	rec               dynamo.Record
}

func goldenFiles(t *testing.T) []goldenFile {
	t.Helper()
	return goldenFilesIn(t, "filestore")
}

// goldenFilesIn reads a captured file store under testdata.
func goldenFilesIn(t *testing.T, store string) []goldenFile {
	t.Helper()
	var out []goldenFile
	for _, b := range dynamo.Buckets {
		dir := filepath.Join("testdata", store, filepath.FromSlash(b))
		ents, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.NotEmpty(t, ents, b)
		for _, e := range ents {
			v, err := os.ReadFile(filepath.Join(dir, e.Name()))
			require.NoError(t, err)
			key, err := dynamo.FileKey(b, e.Name())
			require.NoError(t, err)
			rec, err := dynamo.Decode(v)
			require.NoError(t, err, e.Name())
			out = append(out, goldenFile{bucket: b, name: e.Name(), key: key, value: v, rec: rec})
		}
	}
	return out
}

func goldenEtcd(t *testing.T) []etcdRecord {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "etcd.json"))
	require.NoError(t, err)
	var recs []etcdRecord
	require.NoError(t, json.Unmarshal(b, &recs))
	require.NotEmpty(t, recs)
	return recs
}

// The keys name what the values hold: the instance id in hex after the
// endpoint, the publisher id in hex after the topic.
func TestGoldenKeysMatchValues(t *testing.T) {
	check := func(t *testing.T, key string, rec dynamo.Record) {
		parts := strings.Split(key, "/")
		last, err := strconv.ParseUint(parts[len(parts)-1], 16, 64)
		require.NoError(t, err, key)
		switch {
		case rec.Instance != nil:
			require.Equal(t, strings.Join([]string{dynamo.BucketInstances, rec.Instance.Endpoint.String()}, "/"), strings.Join(parts[:len(parts)-1], "/"))
			require.Equal(t, rec.Instance.ID, last)
		case rec.Model != nil:
			require.Equal(t, dynamo.BucketModels+"/"+rec.Model.Endpoint.String(), strings.Join(parts[:len(parts)-1], "/"))
			require.Equal(t, rec.Model.InstanceID, last)
		case rec.Channel != nil:
			require.True(t, strings.HasPrefix(key, dynamo.BucketEventChannels+"/"), key)
			require.Equal(t, rec.Channel.Topic, parts[len(parts)-2])
			require.Equal(t, rec.Channel.PublisherID, last)
		case rec.Source != nil:
			require.True(t, strings.HasPrefix(key, dynamo.BucketEventSources+"/"), key)
			require.Equal(t, rec.Source.Topic, parts[len(parts)-2])
			require.Equal(t, rec.Source.PublisherID, last)
		}
	}
	t.Run("file", func(t *testing.T) {
		for _, f := range goldenFiles(t) {
			check(t, f.key, f.rec)
			// Dynamo escapes every byte but letters and digits.
			require.Equal(t, f.name, escapeKey(strings.TrimPrefix(f.key, f.bucket+"/")))
		}
	})
	t.Run("etcd", func(t *testing.T) {
		for _, r := range goldenEtcd(t) {
			rec, err := dynamo.Decode(r.Value)
			require.NoError(t, err, r.Key)
			check(t, r.Key, rec)
		}
	})
}

// goldenState loads testdata/filestore or testdata/etcd.json into a State.
func goldenState(t *testing.T, backend string) *dynamo.State {
	t.Helper()
	var st dynamo.State
	if backend == "file" {
		for _, f := range goldenFiles(t) {
			require.NoError(t, st.Put(f.key, f.value, 0))
		}
	} else {
		for _, r := range goldenEtcd(t) {
			require.NoError(t, st.Put(r.Key, r.Value, r.Lease))
		}
	}
	return &st
}

// checkGoldenWorker checks a deployment of the golden capture's one
// mocker (model "tiny", --block-size 16, --num-gpu-blocks-override 800)
// against the records it was joined from.
func checkGoldenWorker(t *testing.T, d dynamo.Deployment, recs []dynamo.Record) {
	t.Helper()
	require.Empty(t, d.Waiting)
	require.Len(t, d.Workers, 1)
	w := d.Workers[0]
	var card *dynamo.ModelCard
	var kvChannel *dynamo.Channel
	var inst, query *dynamo.Instance
	topics := map[string]bool{}
	for _, r := range recs {
		switch {
		case r.Model != nil:
			card = r.Model
		case r.Instance != nil && strings.HasPrefix(r.Instance.Endpoint.Name, "worker_kv_query_source_"):
			query = r.Instance
		case r.Instance != nil && r.Instance.Endpoint.Name == "generate":
			inst = r.Instance
		case r.Channel != nil && r.Channel.Topic == dynamo.TopicKVEvents:
			kvChannel = r.Channel
		case r.Channel != nil:
			topics[r.Channel.Topic] = true
		}
	}
	require.NotNil(t, card)
	require.NotNil(t, inst)
	require.NotNil(t, kvChannel)
	require.Equal(t, inst.ID, w.InstanceID)
	require.Equal(t, card.InstanceID, w.InstanceID)
	require.Equal(t, dynamo.EndpointID{Namespace: "dynamo", Component: "backend", Name: "generate"}, w.Endpoint)
	require.Equal(t, "tiny", w.Model)
	require.Equal(t, 16, w.BlockSize)
	require.Equal(t, 800, w.KVBlocks)
	require.Equal(t, 1, w.DPSize)
	require.Equal(t, "aggregated", w.WorkerType)
	require.Equal(t, "tcp", w.RequestPlane.Kind)
	require.True(t, strings.HasPrefix(w.RequestPlane.Address, "127.0.0.1:"), w.RequestPlane.Address)
	// The publisher recovers from the worker's KV query endpoint, which
	// the worker registers as an instance of its own.
	require.NotNil(t, query)
	require.Equal(t, w.InstanceID, query.ID)
	require.Equal(t, []dynamo.Publisher{{ID: kvChannel.PublisherID, DPRank: 0, Transport: "Zmq", Endpoints: kvChannel.Endpoints,
		Recovery: &query.Transport}}, w.KVEvents)
	require.True(t, strings.HasPrefix(kvChannel.Endpoints[0], "tcp://127.0.0.1:"), kvChannel.Endpoints[0])
	var got []string
	for _, m := range d.Metrics {
		got = append(got, m.Topic)
		require.Equal(t, "Zmq", m.Transport)
	}
	require.Equal(t, []string{dynamo.TopicForwardPassMetrics, dynamo.TopicKVMetrics}, got)
	require.True(t, topics[dynamo.TopicKVMetrics] && topics[dynamo.TopicForwardPassMetrics])
}

func TestGoldenDeployment(t *testing.T) {
	var fileRecs, etcdRecs []dynamo.Record
	for _, f := range goldenFiles(t) {
		fileRecs = append(fileRecs, f.rec)
	}
	for _, r := range goldenEtcd(t) {
		rec, err := dynamo.Decode(r.Value)
		require.NoError(t, err)
		etcdRecs = append(etcdRecs, rec)
	}
	t.Run("file", func(t *testing.T) {
		d := goldenState(t, "file").Deployment(dynamo.Selector{Namespace: "dynamo", Model: "tiny"})
		checkGoldenWorker(t, d, fileRecs)
		require.Empty(t, d.Workers[0].Metrics, "the file store does not tie load channels to a worker")
	})
	t.Run("etcd", func(t *testing.T) {
		d := goldenState(t, "etcd").Deployment(dynamo.Selector{Component: "backend", Endpoint: "generate"})
		checkGoldenWorker(t, d, etcdRecs)
		require.Equal(t, d.Metrics, d.Workers[0].Metrics, "etcd ties them by lease")
	})
}

func TestSelector(t *testing.T) {
	st := goldenState(t, "file")
	for _, tc := range []struct {
		sel  dynamo.Selector
		want int
	}{
		{dynamo.Selector{}, 1},
		{dynamo.Selector{Namespace: "dynamo", Component: "backend", Endpoint: "generate", Model: "tiny"}, 1},
		{dynamo.Selector{Namespace: "other"}, 0},
		{dynamo.Selector{Component: "prefill"}, 0},
		{dynamo.Selector{Endpoint: "worker_kv_query_source"}, 0},
		{dynamo.Selector{Model: "llama"}, 0},
	} {
		d := st.Deployment(tc.sel)
		require.Len(t, d.Workers, tc.want, "%+v", tc.sel)
		if tc.want == 0 {
			require.Empty(t, d.Metrics)
		}
	}
}

// edit returns the golden file whose key has the prefix, with its value
// edited by f (nil: the key is left out).
func withFiles(t *testing.T, edit func(f *goldenFile) bool) dynamo.Deployment {
	t.Helper()
	var st dynamo.State
	for _, f := range goldenFiles(t) {
		if !edit(&f) {
			continue
		}
		if err := st.Put(f.key, f.value, 0); err != nil {
			require.ErrorIs(t, err, dynamo.ErrValue)
		}
	}
	return st.Deployment(dynamo.Selector{})
}

func TestDeploymentWaiting(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(f *goldenFile) bool
		want string
	}{
		{"no instance", func(f *goldenFile) bool { return f.bucket != dynamo.BucketInstances }, "without an instance"},
		{"no event source", func(f *goldenFile) bool { return f.bucket != dynamo.BucketEventSources }, "no kv-events publisher for dp rank 0"},
		{"no event channel", func(f *goldenFile) bool {
			return f.rec.Channel == nil || f.rec.Channel.Topic != dynamo.TopicKVEvents
		}, "no kv-events publisher for dp rank 0"},
		{"two ranks, one publisher", func(f *goldenFile) bool {
			if f.rec.Model != nil {
				f.value = []byte(strings.Replace(string(f.value), `"data_parallel_size":1`, `"data_parallel_size":2`, 1))
			}
			return true
		}, "no kv-events publisher for dp rank 1"},
		{"ranks from 1", func(f *goldenFile) bool {
			if f.rec.Model != nil {
				f.value = []byte(strings.Replace(string(f.value), `"data_parallel_start_rank":0`, `"data_parallel_start_rank":1`, 1))
			}
			return true
		}, "no kv-events publisher for dp rank 1"}, // its one publisher is of rank 0
		{"card gone bad", func(f *goldenFile) bool {
			if f.rec.Model != nil {
				f.value = []byte(strings.Replace(string(f.value), `"kv_cache_block_size":16`, `"kv_cache_block_size":-1`, 1))
			}
			return true
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := withFiles(t, tc.edit)
			require.Empty(t, d.Workers)
			if tc.want == "" {
				require.Empty(t, d.Waiting)
				return
			}
			require.Len(t, d.Waiting, 1)
			for _, err := range d.Waiting {
				require.ErrorIs(t, err, dynamo.ErrIncomplete)
				require.ErrorContains(t, err, tc.want)
			}
		})
	}
	// A card that does not publish events needs no publisher.
	d := withFiles(t, func(f *goldenFile) bool {
		if f.rec.Model != nil {
			f.value = []byte(strings.Replace(string(f.value), `"kv_event_publishing_enabled":true`, `"kv_event_publishing_enabled":false`, 1))
		}
		return f.bucket != dynamo.BucketEventSources
	})
	require.Len(t, d.Workers, 1)
	require.Empty(t, d.Workers[0].KVEvents)
}

func TestDecodeErrors(t *testing.T) {
	for _, bad := range []string{
		``, `{`, `[]`, `{"type":"Nope"}`, `{"type":"Endpoint"}`,
		`{"type":"Endpoint","namespace":"n","component":"c","endpoint":"e","transport":{"tcp":"a"}}`,
		`{"type":"Endpoint","namespace":"n","component":"c","endpoint":"e","instance_id":1,"transport":{"tcp":"a","http":"b"}}`,
		`{"type":"Endpoint","namespace":"n","component":"c","endpoint":"e","instance_id":1,"transport":{"tcp":""}}`,
		`{"type":"Endpoint","namespace":"n","component":"","endpoint":"e","instance_id":1,"transport":{"tcp":"a"}}`,
		`{"type":"Endpoint","namespace":"n","component":"c","endpoint":"e","instance_id":-1,"transport":{"tcp":"a"}}`,
		`{"type":"Model","namespace":"n","component":"c","endpoint":"e","instance_id":1,"card_json":{"display_name":"m"}}`,
		`{"type":"Model","namespace":"n","component":"c","endpoint":"e","instance_id":1,"card_json":{"kv_cache_block_size":16}}`,
		`{"type":"Model","namespace":"n","component":"c","endpoint":"e","instance_id":1,"card_json":{"display_name":"m","kv_cache_block_size":16,"runtime_config":{"data_parallel_size":-2}}}`,
		`{"type":"Model","namespace":"n","component":"c","endpoint":"e","instance_id":1,"card_json":{"display_name":"m","kv_cache_block_size":16,"runtime_config":{"total_kv_blocks":-1}}}`,
		`{"type":"EventChannel","scope":{"kind":"endpoint","endpoint":{"namespace":"n","component":"c","name":"e"}},"topic":"t","instance_id":1,"transport":{"kind":"Zmq","config":{}}}`,
		`{"type":"EventChannel","scope":{"kind":"endpoint","endpoint":{"namespace":"n","component":"c","name":"e"}},"topic":"t","instance_id":1,"transport":{"kind":"Udp","config":{"endpoint":"x"}}}`,
		`{"type":"EventChannel","scope":{"kind":"galaxy"},"topic":"t","instance_id":1,"transport":{"kind":"Zmq","config":{"endpoint":"x"}}}`,
		`{"type":"EventChannel","scope":{"kind":"namespace","name":"n"},"instance_id":1,"transport":{"kind":"Zmq","config":{"endpoint":"x"}}}`,
		`{"type":"EventSource","scope":{"kind":"component","namespace":"n","component":"c"},"topic":"t","publisher_id":1,"metadata":{}}`,
		`{"type":"EventSource","scope":{"kind":"component","namespace":"n","component":"c"},"topic":"t","publisher_id":1,"metadata":{"worker":{"worker_id":2,"dp_rank":-1}}}`,
	} {
		_, err := dynamo.Decode([]byte(bad))
		require.ErrorIs(t, err, dynamo.ErrValue, bad)
	}
	// The other scope kinds and transports decode.
	for _, good := range []string{
		`{"type":"EventChannel","scope":{"kind":"namespace","name":"n"},"topic":"t","instance_id":1,"transport":{"kind":"Nats","config":{"subject_prefix":"namespace.n"}}}`,
		`{"type":"EventChannel","scope":{"kind":"component","namespace":"n","component":"c"},"topic":"t","instance_id":1,"transport":{"kind":"ZmqBroker","config":{"xsub_endpoints":["tcp://a:1"],"xpub_endpoints":["tcp://a:2"]}}}`,
		`{"type":"EventSource","scope":{"kind":"component","namespace":"n","component":"c"},"topic":"t","publisher_id":1,"metadata":{"worker":{"worker_id":2}}}`,
	} {
		_, err := dynamo.Decode([]byte(good))
		require.NoError(t, err, good)
	}
}

func TestFileKey(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"dynamo%2Fbackend%2Fgenerate%2F65a23411d0caa38f", "v1/instances/dynamo/backend/generate/65a23411d0caa38f"},
		{"dynamo%2Fbackend%2Fworker%5Fkv%5Fquery%5Fsource%5F1%2F2", "v1/instances/dynamo/backend/worker_kv_query_source_1/2"},
		{"a%2Db", "v1/instances/a-b"},
		{"plain", "v1/instances/plain"},
	} {
		got, err := dynamo.FileKey(dynamo.BucketInstances, tc.name)
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
	for _, bad := range []string{"", "a%2", "a%zz"} {
		_, err := dynamo.FileKey(dynamo.BucketInstances, bad)
		require.ErrorIs(t, err, dynamo.ErrValue, bad)
	}
}

func TestDefaultFileDir(t *testing.T) {
	t.Setenv("DYN_FILE_KV", "/srv/kv")
	require.Equal(t, "/srv/kv", dynamo.DefaultFileDir())
	t.Setenv("DYN_FILE_KV", "")
	require.Equal(t, filepath.Join(os.TempDir(), "dynamo_store_kv"), dynamo.DefaultFileDir())
}

// Each captured shape (one worker, one worker with two data-parallel
// ranks, two workers in one process) joins into its workers, ranks and
// publishers, and registers that many cache domains with a Pool.
func TestGoldenShapes(t *testing.T) {
	for _, shape := range goldenShapes {
		t.Run(shape.dir, func(t *testing.T) {
			var st dynamo.State
			for _, f := range goldenFilesIn(t, shape.dir) {
				require.NoError(t, st.Put(f.key, f.value, 0))
			}
			d := st.Deployment(dynamo.Selector{Model: "tiny"})
			require.Empty(t, d.Waiting)
			require.Len(t, d.Workers, shape.workers)
			require.Len(t, d.Metrics, 2*shape.workers, "a kv_metrics and a forward-pass-metrics publisher per worker")
			endpoints := map[string]bool{}
			for _, w := range d.Workers {
				require.Equal(t, shape.dpRanks, w.DPSize)
				require.Equal(t, 800, w.KVBlocks)
				require.Len(t, w.KVEvents, shape.dpRanks)
				for r, p := range w.KVEvents {
					require.Equal(t, r, p.DPRank)
					require.False(t, endpoints[p.Endpoints[0]], "one publisher per rank")
					endpoints[p.Endpoints[0]] = true
				}
			}
			r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
			require.NoError(t, err)
			pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, RetryInterval: -1,
				DynamoEvents: func(*discovery.Engine, discovery.DynamoPublisher) (discovery.EventRunner, error) { return idle{}, nil }})
			require.NoError(t, err)
			defer pool.Close()
			dynamo.PoolSink(pool, nil).Sync(context.Background(), d)
			require.Empty(t, pool.Rejected())
			var want []kvroute.WorkerKey
			for _, w := range d.Workers {
				for rank := range w.DPSize {
					want = append(want, kvroute.WorkerKey{ID: kvroute.WorkerID(w.InstanceID), Rank: kvroute.DPRank(rank)})
				}
			}
			require.ElementsMatch(t, want, r.Workers())
		})
	}
}

// idle is an event runner that waits for its end.
type idle struct{}

func (idle) Run(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

func TestDecodeRecovery(t *testing.T) {
	src := func(transport string) string {
		return `{"type":"EventSource","scope":{"kind":"component","namespace":"n","component":"c"},"topic":"kv-events","publisher_id":1,` +
			`"metadata":{"worker":{"worker_id":2,"dp_rank":1},"recovery_target":{"instance_id":2,"transport":` + transport + `}}}`
	}
	for _, tc := range []struct {
		transport string
		want      *dynamo.Transport
	}{
		{`{"tcp":"127.0.0.1:9/2/n/c/worker_kv_query_source_1"}`, &dynamo.Transport{Kind: "tcp", Address: "127.0.0.1:9/2/n/c/worker_kv_query_source_1"}},
		{`{"nats_tcp":"n.c.q"}`, &dynamo.Transport{Kind: "nats_tcp", Address: "n.c.q"}},
		{`{"tcp":"127.0.0.1:9"}`, nil},
		{`{"tcp":"nohost/x"}`, nil},
		{`{"tcp":""}`, nil},
		{`{}`, nil},
	} {
		rec, err := dynamo.Decode([]byte(src(tc.transport)))
		if tc.want == nil {
			require.ErrorIs(t, err, dynamo.ErrValue, tc.transport)
			continue
		}
		require.NoError(t, err, tc.transport)
		require.Equal(t, tc.want, rec.Source.Recovery)
		require.Equal(t, 1, rec.Source.DPRank)
	}
}
