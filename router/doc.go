// Package router decides, in-process and in microseconds, which inference
// worker serves each LLM request: the one that already holds the KV cache
// of the longest prefix of its prompt, unless it is too busy.
//
// # Usage
//
// The host's duties, in order:
//
//  1. Create the Router with New, with the engines' block size in
//     Config.Hasher and a cost function (kvroute's default when nil, see
//     "The default policy" below).
//  2. Register every engine with AddWorker (a Worker: its id,
//     data-parallel ranks, block size and role); UpdateWorker and
//     RemoveWorker as the pool changes.
//  3. Feed the engines' KV events into Router.Index (package kvevents does
//     this from ZMQ or NATS), or set Config.Approximate when they publish
//     none.
//  4. Per request, call Select; send the request to Decision.Worker; call
//     Decision.PrefillDone on the first token and Decision.Done at the end
//     (also on errors and cancellations), with the engine's actual cached
//     tokens when known.
//  5. Report engine metrics with Heartbeat and failures with ReportError,
//     and call CheckHealth periodically (or start RunHealthChecks). A
//     host that probes its engines itself takes a Probe (Router.Probe)
//     as each probe starts and reports the result through it, so that a
//     late result of a worker removed meanwhile does not reach one added
//     under its id since.
//
// A complete integration:
//
//	r, _ := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
//	_ = r.AddWorker(router.StaticWorker{WorkerID: 1, Block: 16})
//	_ = r.AddWorker(router.StaticWorker{WorkerID: 2, Block: 16})
//	go r.RunHealthChecks(ctx, time.Second)
//	// go sub.Run(ctx) // a kvevents subscriber applying events to r.Index()
//
//	d, err := r.Select(ctx, &router.Request{Tokens: promptTokens})
//	if err != nil {
//		return err // scheduling.ErrAllBusy, router.ErrNoWorkers, ...
//	}
//	resp, err := send(d.Worker, prompt) // the host's own client
//	d.PrefillDone()
//	d.Done(router.Outcome{Err: err, CachedTokens: resp.CachedTokens, CachedTokensKnown: true})
//
// # The default policy
//
// The zero Config routes by scheduling.NewDefaultCost: NVIDIA Dynamo's
// KV-router cost weighted towards the cache (overlap weight 2, prefill load
// scale 16, 16 blocks per active request), so that each prompt goes to the
// worker holding most of its prefix and a shared prefix stays on few
// workers, plus a charge for the distinct KV a worker's requests in flight
// would hold (8,000 blocks for a whole cache), so that a worker does not
// gather distinct prompts whose KV slows its decode, inside a
// scheduling.BoundedLoad that keeps every worker within twice its fair
// share of the requests in flight, so that a hot prefix spills over
// instead of queueing on one worker. The router counts the load of the
// requests it routed itself and takes only capacities from engines' load
// reports (Config.LoadReports): a report lags its engine, and one that
// still shows a drained worker busy would keep it idle. Hosts whose
// workers also take traffic from other routers set LoadReportMerged.
// Measured end to end on Dynamo 1.6.1's mocker engines (bench/dynamo),
// it keeps more of the prompts cached than Dynamo's own default router
// with throughput within 3% of it; BENCHMARKS.md has the figures. The
// host tunes nothing; to route exactly as Dynamo does, set Cost to
// scheduling.NewDynamoCost with the zero config.
//
// # Several router replicas
//
// Replicas behind one load balancer each keep the whole index (every
// replica receives every KV event) and must count each other's requests.
// Give each replica's router a tracker (Config.LoadTracker) that it
// shares with a LoadSync (Config.LoadSync) exchanging the requests with
// the other replicas, such as kvevents/natsx.Replica over NATS: each
// router then counts its own requests and its peers' exactly once, and
// LoadChanged wakes its queue when peers' requests end. Set
// Config.RemoveGrace too: the replicas' event stream goes on after a
// worker's removal, so a worker removed and added again within the grace
// keeps its blocks in the index, while one that does not come back has
// them removed when the grace ends (PurgeWorker removes them at once).
//
// # Health
//
// Liveness (heartbeats) and error health (request outcomes) are separate
// signals and a worker's health is the worse of the two (HealthConfig): a
// heartbeat never clears inference errors.
//
// # Concurrency
//
// Select and the Decision methods are safe for concurrent use and take no
// router-wide lock: the worker set is an immutable snapshot behind an
// atomic pointer, replaced by AddWorker, UpdateWorker, RemoveWorker and
// PurgeWorker (which serialise among themselves). Select blocks only in the admission
// queue (Config.Queue), and then until its context ends.
//
// The router starts no goroutines and does no I/O; RunHealthChecks is the
// only optional goroutine, started by the host.
package router
