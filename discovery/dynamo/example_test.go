package dynamo_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

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
