// Package scheduling turns a request's candidate workers, with their cached
// prefix and load, into a routing choice.
//
// It holds the parts of a KV-cache-aware router that do not depend on the
// index: cost functions ([CostFunc]: [DynamoCost], [WeightedScore],
// [StalenessCost], [BoundedLoad], kvroute's default [NewDefaultCost] and the
// baselines [Random], [RoundRobin], [LeastLoaded]),
// the [Selector] (argmin with a fair tie-break, or softmax with a
// temperature), [BusyThresholds], the active-request load [Tracker] and the
// admission [Queue] with FCFS, LCFS and WSPT policies and strict priority
// classes. It imports only the root kvroute package, so a host with its own
// prefix index can use it alone. It does no I/O and starts no goroutines;
// time comes from an injected [kvroute.Clock].
//
// # Usage
//
// A host routes each request in these steps:
//
//  1. Once: build a cost function (for example [NewDefaultCost]), a
//     [Selector], a [Tracker], and optionally a [Queue] and
//     [BusyThresholds].
//  2. Per request: hash the prompt into sequence hashes, ask the index how
//     many leading blocks each worker caches per tier, and fill a reused
//     []Candidate with them; [Tracker.FillLoad] adds the router's view of
//     each worker's load, and engine metrics may add the rest of [Load].
//  3. Drop busy workers with [BusyThresholds.Filter]; when none is left
//     the error matches [ErrAllBusy].
//  4. If queueing, call [Queue.Wait] with [Queue.Saturated] of the
//     candidates; refresh the loads after it returns.
//  5. Call [Choose] (or [CostFunc.Costs] then [Selector.Select]) with a
//     reused []float64 to pick a candidate.
//  6. [Tracker.Add] the request on the chosen worker. On its first token
//     call [Tracker.PrefillDone], as tokens stream [Tracker.AddOutputTokens],
//     and on completion or cancellation [Tracker.Free]; after each of these
//     call [Queue.Release] when the workers are no longer saturated.
//  7. Periodically call [Tracker.Expire] so that requests whose Free was
//     lost stop counting.
//
// The wiring, with the index lookup left to the host:
//
//	cost, _ := scheduling.NewDefaultCost(16)
//	sel, _ := scheduling.NewSelector(scheduling.SelectorConfig{})
//	tracker, _ := scheduling.NewTracker(scheduling.TrackerConfig{BlockSize: 16})
//	busy := scheduling.BusyThresholds{PrefillTokens: 2}
//
//	cands = cands[:0]
//	for _, w := range workers {
//		c := scheduling.Candidate{Worker: w, Cached: index.Depth(w, seqs)}
//		tracker.FillLoad(&c, seqs)
//		cands = append(cands, c)
//	}
//	eligible, err := busy.Filter(cands)
//	if err != nil {
//		return err // errors.Is(err, scheduling.ErrAllBusy)
//	}
//	i, err := scheduling.Choose(cost, sel, &req, eligible, costs[:cap(costs)])
//	if err != nil {
//		return err
//	}
//	err = tracker.Add(id, eligible[i].Worker, seqs, req.PromptTokens-eligible[i].CachedBlocks()*16)
//
// # Concurrency
//
// Every exported type is safe for concurrent use. Cost functions and the
// Selector are immutable apart from lock-free counters; the Tracker shards
// its state; the Queue takes one mutex only while requests wait. Slices
// passed in are not retained.
package scheduling
