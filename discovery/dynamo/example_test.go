package dynamo_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	kvdynamo "github.com/kvroute/kvroute/kvevents/dynamo"
	"github.com/kvroute/kvroute/router"

	"github.com/kvroute/kvroute/discovery/dynamo"
)

// A FileWatcher reads the store a Dynamo mocker wrote (here a captured
// copy) and reports its one worker.
func ExampleFileWatcher() {
	dir, err := os.MkdirTemp("", "dynkv")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	if err := os.CopyFS(dir, os.DirFS(filepath.Join("testdata", "filestore"))); err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &dynamo.FileWatcher{Dir: dir, Selector: dynamo.Selector{Model: "tiny"},
		TTL: -1} // the copy's files are old: do not age them out
	_ = w.Run(ctx, dynamo.SinkFunc(func(_ context.Context, d dynamo.Deployment) {
		for _, wk := range d.Workers {
			fmt.Printf("%s: model %s, blocks of %d tokens, %d blocks, %d rank(s), %d kv-events publisher(s)\n",
				wk.Endpoint, wk.Model, wk.BlockSize, wk.KVBlocks, wk.DPSize, len(wk.KVEvents))
		}
		fmt.Println(len(d.Metrics), "load channels")
		cancel()
	}))
	// Output:
	// dynamo/backend/generate: model tiny, blocks of 16 tokens, 800 blocks, 1 rank(s), 1 kv-events publisher(s)
	// 2 load channels
}

// PoolSink registers a deployment's workers with a router through a
// discovery.Pool, under their Dynamo instance ids, and has an event-plane
// subscriber follow their kv-events and load channels.
func ExamplePoolSink() {
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	if err != nil {
		panic(err)
	}
	sub, err := kvdynamo.New(kvdynamo.Config{Sink: r.Index(), Load: r})
	if err != nil {
		panic(err)
	}
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, DynamoEvents: dynamo.KVEvents(sub)})
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	// A watcher would call Sync; here one deployment read from a captured
	// store.
	var st dynamo.State
	for _, b := range dynamo.Buckets {
		dir := filepath.Join("testdata", "filestore", filepath.FromSlash(b))
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			key, _ := dynamo.FileKey(b, e.Name())
			value, _ := os.ReadFile(filepath.Join(dir, e.Name()))
			if err := st.Put(key, value, 0); err != nil {
				panic(err)
			}
		}
	}
	d := st.Deployment(dynamo.Selector{Model: "tiny"})
	dynamo.PoolSink(pool, sub).Sync(context.Background(), d)
	for _, k := range r.Workers() {
		fmt.Println("routes to instance", uint64(k.ID) == d.Workers[0].InstanceID, "rank", k.Rank)
	}
	m := pool.Members()[0]
	fmt.Println(strings.TrimSuffix(m.Name, strconv.FormatUint(d.Workers[0].InstanceID, 16)), m.Ranks, "rank,", len(m.DynamoEvents), "kv-events endpoint")
	// Output:
	// routes to instance true rank 0
	// dynamo/backend/generate/ 1 rank, 1 kv-events endpoint
}
