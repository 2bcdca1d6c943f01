package dynamo_test

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvroute/kvroute/discovery/dynamo"
	"github.com/kvroute/kvroute/internal/dynamotest"
	"github.com/kvroute/kvroute/internal/etcdtest"
)

// etcdRecord is one key of testdata/etcd.json.
type etcdRecord struct {
	Key   string          `json:"key"`
	Lease int64           `json:"lease"`
	Value json.RawMessage `json:"value"`
}

// goldenShape is one captured file store: the mocker's extra arguments
// and what it registers.
type goldenShape struct {
	dir              string
	args             []string
	workers, dpRanks int
}

var goldenShapes = []goldenShape{
	{dir: "filestore", workers: 1, dpRanks: 1},
	{dir: "filestore-dp2", args: []string{"--data-parallel-size", "2"}, workers: 1, dpRanks: 2},
	{dir: "filestore-2workers", args: []string{"--num-workers", "2"}, workers: 2, dpRanks: 1},
}

// TestCaptureStore re-creates the golden store data from real mockers:
// testdata/filestore* (the files a mocker wrote under DYN_FILE_KV, for each
// goldenShape) and testdata/etcd.json (the keys, leases and values one
// mocker put into etcd). It runs only with KVROUTE_DYNAMO_CAPTURE=1; see
// testdata/capture.sh.
func TestCaptureStore(t *testing.T) {
	if os.Getenv("KVROUTE_DYNAMO_CAPTURE") != "1" {
		t.Skip("captures golden data only with KVROUTE_DYNAMO_CAPTURE=1 (testdata/capture.sh)")
	}
	model := filepath.Join(t.TempDir(), "model")
	dynamotest.WriteModel(t, model)

	for _, shape := range goldenShapes {
		store := t.TempDir()
		m := startMocker(t, model, dynEnv{backend: "file", store: store}, shape.args...)
		waitDeployment(t, func() dynamo.Deployment {
			return scanOnce(t, &dynamo.FileWatcher{Dir: store})
		}, shape.workers, m)
		out := filepath.Join("testdata", shape.dir)
		require.NoError(t, os.RemoveAll(out))
		require.NoError(t, os.CopyFS(out, os.DirFS(store)))
		m.Stop(syscall.SIGTERM)
	}

	c, url := etcdtest.Start(t)
	m := startMocker(t, model, dynEnv{backend: "etcd", store: url})
	var recs []etcdRecord
	waitDeployment(t, func() dynamo.Deployment {
		resp, err := c.Get(context.Background(), "v1/", clientv3.WithPrefix())
		require.NoError(t, err)
		var st dynamo.State
		recs = recs[:0]
		for _, kv := range resp.Kvs {
			require.NoError(t, st.Put(string(kv.Key), kv.Value, kv.Lease))
			recs = append(recs, etcdRecord{Key: string(kv.Key), Lease: kv.Lease, Value: kv.Value})
		}
		return st.Deployment(dynamo.Selector{})
	}, 1, m)
	b, err := json.MarshalIndent(recs, "", "  ")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join("testdata", "etcd.json"), append(b, '\n'), 0o644))
	m.Stop(syscall.SIGTERM)
}

// waitDeployment polls get until it returns n workers with kv-events
// publishers and both load channels, for at most a minute.
func waitDeployment(t *testing.T, get func() dynamo.Deployment, n int, m *dynamotest.Process) dynamo.Deployment {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		d := get()
		if len(d.Workers) == n && len(d.Metrics) >= 2 {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d workers, want %d; waiting: %v; mocker log:\n%s", len(d.Workers), n, d.Waiting, m.Tail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// scanOnce runs w until its first Sync and returns that deployment.
func scanOnce(t *testing.T, w *dynamo.FileWatcher) dynamo.Deployment {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan dynamo.Deployment, 1)
	go func() {
		_ = w.Run(ctx, dynamo.SinkFunc(func(_ context.Context, d dynamo.Deployment) {
			select {
			case got <- d:
			default:
			}
			cancel()
		}))
	}()
	return <-got
}

// copyStore copies the golden file store into a new directory with every
// file's modification time set to now, as a live writer keeps it.
func copyStore(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS(filepath.Join("testdata", "filestore"))))
	now := time.Now()
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return os.Chtimes(p, now, now)
	}))
	return dir
}
