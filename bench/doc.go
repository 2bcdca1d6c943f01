// Package bench simulates a cluster of inference engines in virtual time to
// measure how routing policies trade KV-cache hits against load.
//
// The engines are models (a prefix cache of a fixed number of blocks with LRU
// eviction of unreferenced blocks, chunked prefill at a fixed throughput,
// decode steps that slow down as the batch grows, a maximum batch and a
// waiting queue), but the router is the real router.Router: engines publish
// their KV events encoded as vLLM does (kvevents.AppendBatch), and after a
// configurable delay the simulator decodes and converts them
// (kvevents.DecodeBatch, kvevents.Converter) and applies them to the router's
// index, so the router routes on a stale view as it would in production.
// Every routed request calls Decision.PrefillDone at its first token and
// Decision.Done with the cached tokens its engine actually found.
//
// EngineConfig.Timing chooses the engines' step time: a fixed overhead, a
// cost per decoding request and a prefill throughput, or the timing of NVIDIA
// Dynamo's mocker engines (TimingDynamoMocker), with which scenarios "e" and
// "f" reproduce the end-to-end benchmark on those engines (bench/dynamo) in
// virtual time. Requests arrive at their workload's times (an open loop) or,
// with Config.Concurrency, from that many clients that each wait for their
// last request to finish (a closed loop).
//
// # Usage
//
// A comparison takes three steps:
//
//  1. Build a workload: SharedPrefix, Chat, Agentic, or FromMooncake with
//     records from ReadMooncake; or a calibrated cluster and workload at
//     once with NewScenario ("a" to "f").
//  2. Choose policies: Policies returns the baselines, the weighted score,
//     Dynamo's default cost and KVRoutePolicy; a Policy is any function that
//     returns a router.Config.
//  3. Call Run for one policy or Compare for several, and print the results
//     with WriteTable, WriteCSV or WriteJSON.
//
// In code:
//
//	sc, err := bench.NewScenario("a", bench.ScenarioOptions{Requests: 2000, Seed: 1})
//	if err != nil {
//		return err
//	}
//	results, err := bench.Compare(ctx, sc.Config, sc.Workload, bench.Policies(), 0)
//	if err != nil {
//		return err
//	}
//	return bench.WriteTable(os.Stdout, results)
//
// The command bench/cmd/kvsim does this from the command line, and
// examples/quickstart runs workload (a) for every policy.
//
// # Determinism
//
// A run is a discrete-event loop on one goroutine: arrivals, engine steps,
// KV-event deliveries and load reports are processed in virtual-time order
// (ties in scheduling order), the router reads the virtual clock and its
// selector is seeded from Config.Seed. Equal configurations, workloads and
// policies give equal results; only the measured Select wall times differ
// between runs. Compare runs policies in parallel, each on its own router.
//
// # Measurements
//
// Result reports the token hit rate (cached prompt tokens as the engines
// report them over all prompt tokens), time to first token and end-to-end
// latency (from arrival, including any wait), throughput, load imbalance
// (largest over mean time-averaged active requests per engine, and the
// stricter time average of the instantaneous max over mean) and the wall time
// of each Router.SelectInto call.
package bench
