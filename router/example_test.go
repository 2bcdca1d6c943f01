package router_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
)

func Example() {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	r, _ := router.New(router.Config{Hasher: h})
	for id := range 3 {
		_ = r.AddWorker(router.StaticWorker{WorkerID: kvroute.WorkerID(id + 1), Block: 4})
	}

	// Worker 2's engine reports (through its KV events) that it cached a
	// system prompt of three blocks.
	system := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	blocks := h.AppendBlockHashes(nil, system)
	ev := &kvroute.Event{Kind: kvroute.EventStored, Worker: kvroute.WorkerKey{ID: 2}, ID: 1}
	for i, b := range blocks {
		ev.Blocks = append(ev.Blocks, kvroute.StoredBlock{External: kvroute.ExternalHash(100 + i), Hash: b})
	}
	_ = r.Index().Apply(ev)

	prompt := append(system, 42, 43, 44, 45)
	d, err := r.Select(context.Background(), &router.Request{Tokens: prompt})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("worker %s, %d of %d blocks cached\n", d.Worker, d.CachedBlocks, d.Blocks)
	d.PrefillDone() // first token
	d.Done(router.Outcome{CachedTokens: 12, CachedTokensKnown: true})
	// Output: worker 2/0, 3 of 4 blocks cached
}

func ExampleRouter_Stats() {
	r, _ := router.New(router.Config{})
	_ = r.AddWorker(router.StaticWorker{WorkerID: 1})
	d, _ := r.Select(context.Background(), &router.Request{Tokens: make([]uint32, 40)})
	d.Done(router.Outcome{})
	st := r.Stats()
	fmt.Println(st.Decisions, st.PromptTokens, st.RecommendedSyncInterval)
	// Output: 1 40 5s
}

// A host that probes its engines takes a Probe as each probe starts: the
// result reaches the worker that was probed, not one added under its id
// while the probe was out.
func ExampleRouter_Probe() {
	r, _ := router.New(router.Config{})
	_ = r.AddWorker(router.StaticWorker{WorkerID: 1})
	w := kvroute.WorkerKey{ID: 1}
	p, _ := r.Probe(w)

	// While the probe is out, the engine is replaced under the same id.
	r.RemoveWorker(1)
	_ = r.AddWorker(router.StaticWorker{WorkerID: 1})

	err := p.Failed(errors.New("connection refused"))
	fmt.Println(errors.Is(err, router.ErrUnknownWorker))
	h, _ := r.Health(w)
	fmt.Println(h)
	// Output:
	// true
	// healthy
}
