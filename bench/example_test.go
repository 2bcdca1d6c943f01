package bench_test

import (
	"context"
	"fmt"

	"github.com/kvroute/kvroute/bench"
)

// Compare a cache-blind policy with kvroute's on a small shared-prefix
// workload.
func Example() {
	wl, err := bench.SharedPrefix(bench.SharedPrefixConfig{Requests: 400, Prompts: 24, Rate: 4, Seed: 1})
	if err != nil {
		panic(err)
	}
	cfg := bench.Config{Workers: 4, Engine: bench.EngineConfig{CacheBlocks: 2048}, Seed: 1}
	rr, _ := bench.PolicyByName("round-robin")
	results, err := bench.Compare(context.Background(), cfg, wl, []bench.Policy{rr, bench.KVRoutePolicy()}, 1)
	if err != nil {
		panic(err)
	}
	for _, r := range results {
		fmt.Printf("%s: %d requests, hit rate above 80%%: %t\n", r.Policy, r.Requests, r.HitRate > 0.8)
	}
	// Output:
	// round-robin: 400 requests, hit rate above 80%: false
	// kvroute: 400 requests, hit rate above 80%: true
}

// Build a Mooncake workload from trace records: each hash id becomes 512
// synthetic tokens, the last block cut to the input length.
func ExampleFromMooncake() {
	recs := []bench.TraceRecord{
		{Timestamp: 0, InputLength: 1000, OutputLength: 10, HashIDs: []int64{1, 2}},
		{Timestamp: 500, InputLength: 700, OutputLength: 5, HashIDs: []int64{1, 3}},
	}
	wl, err := bench.FromMooncake(recs, bench.MooncakeConfig{Speed: 2})
	if err != nil {
		panic(err)
	}
	for _, r := range wl.Requests {
		fmt.Println(r.Arrival, r.Prompt.Len(), r.Output.Len)
	}
	// Output:
	// 0s 1000 10
	// 250ms 700 5
}
