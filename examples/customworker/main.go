// Command customworker describes a custom inference engine to the kvroute
// router (router.Worker and router.Capacity), feeds its cache reports to the
// router's index as kvroute.Events, and prints where prompts are routed.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
)

const blockSize = 16

// engine is a custom inference engine as its host knows it.
type engine struct {
	id       kvroute.WorkerID
	name     string
	slots    int // sequences it runs at once
	kvBlocks int // KV-cache size in blocks
}

func (e *engine) ID() kvroute.WorkerID   { return e.id }
func (e *engine) DataParallelRanks() int { return 1 }
func (e *engine) BlockSize() int         { return blockSize }
func (e *engine) Role() router.Role      { return router.RoleAggregated }
func (e *engine) MaxBatchedTokens() int  { return 8192 }
func (e *engine) MaxRequests() int       { return e.slots }
func (e *engine) KVCapacityBlocks() int  { return e.kvBlocks }

var _ router.Capacity = (*engine)(nil)

// tokens returns n token ids from first on.
func tokens(first, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(first + i)
	}
	return out
}

// stored is the event of e caching prompt's full blocks, named ext, ext+1...
func stored(e *engine, prompt []uint32, ext uint64) kvroute.Event {
	ev := kvroute.Event{Kind: kvroute.EventStored, Worker: kvroute.WorkerKey{ID: e.id}}
	for b := range len(prompt) / blockSize {
		block := prompt[b*blockSize : (b+1)*blockSize]
		ev.Blocks = append(ev.Blocks, kvroute.StoredBlock{External: kvroute.ExternalHash(ext + uint64(b)), Tokens: block})
	}
	return ev
}

func run(ctx context.Context, w io.Writer) error {
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: blockSize})})
	if err != nil {
		return err
	}
	engines := map[kvroute.WorkerID]*engine{1: {1, "gpu-a", 64, 4096}, 2: {2, "gpu-b", 64, 4096}}
	for _, e := range engines {
		if err := r.AddWorker(e); err != nil {
			return err
		}
	}
	// gpu-a has served the 256-token system prompt and reports it.
	system := tokens(0, 256)
	ev := stored(engines[1], system, 1000)
	if err := r.Index().Apply(&ev); err != nil {
		return err
	}
	fmt.Fprintf(w, "gpu-a cached the system prompt: %d blocks in the index\n", r.Index().Size().Blocks)

	for _, p := range []struct {
		name   string
		tokens []uint32
	}{
		{"system prompt + question 1", slices.Concat(system, tokens(5000, 16))},
		{"unrelated prompt", tokens(9000, 272)},
		{"system prompt + question 2", slices.Concat(system, tokens(7000, 16))},
	} {
		d, err := r.Select(ctx, &router.Request{Tokens: p.tokens})
		if err != nil {
			return err
		}
		// The request is in flight, and loads its engine, until Done.
		defer d.Done(router.Outcome{CachedTokens: d.CachedTokens, CachedTokensKnown: true})
		fmt.Fprintf(w, "%-27s → %s (predicted cached %d of %d tokens)\n", p.name, engines[d.Worker.ID].name, d.CachedTokens, d.PromptTokens)
	}
	return nil
}

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "customworker:", err)
		os.Exit(1)
	}
}
