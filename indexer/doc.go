// Package indexer is the cluster prefix index: which cache domain holds
// which KV blocks, answered for a request's whole prefix in one lock-free
// walk.
//
// # Usage
//
// The host's duties, in order:
//
//  1. Create one Index per model (block size and namespace) with New, with
//     the same kvroute.Hasher configuration the engines use.
//  2. Feed every engine's KV events to Index.Apply, one worker's events in
//     order (package kvevents decodes and delivers them). Act on the
//     errors: a *GapError asks for a replay from GapError.Want (or a
//     ResetWorker), ErrDuplicate events are dropped, an
//     *UnknownParentError means the worker's view is incomplete.
//  3. For each request, hash the prompt with kvroute.Hasher.AppendSeqHashes
//     into a reused slice and call Index.Match with a reused MatchResult.
//  4. Call RemoveWorker when a worker leaves the pool and ResetWorker when
//     an engine restarts.
//
// Engines that publish no KV events use Approx instead: the host records
// each routing decision with Approx.Insert, and entries expire after a TTL.
//
//	ix, _ := indexer.New(indexer.Config{Hasher: hasher})
//	go func() { // the host's event loop, e.g. a kvevents subscriber
//		for ev := range events {
//			if err := ix.Apply(&ev); errors.Is(err, indexer.ErrGap) {
//				// replay or ix.ResetWorker(ev.Worker)
//			}
//		}
//	}()
//	var res indexer.MatchResult
//	seqs = hasher.AppendSeqHashes(seqs[:0], promptTokens)
//	ix.Match(seqs, &res)
//	for _, m := range res.Workers {
//		fmt.Println(m.Worker, m.Blocks, m.ByTier)
//	}
//
// # Design
//
// A block is named by its chained sequence hash, which already identifies
// its whole path from the root, so the prefix tree is stored as a
// concurrent hash map from sequence hash to node and matching needs one
// lookup per block, never a pointer walk. Engines' own block hashes are
// opaque: each worker keeps a map from its engine hashes to nodes, used to
// find the parent of a Stored event and the blocks of a Removed one.
//
// Worker identities are interned into dense slots; each node holds one
// 64-bit word per tier for every 64 slots, so the holder set of a block in
// a cluster of up to 64 cache domains is four words, updated with atomic
// OR/AND under the map's bucket lock and read with plain atomic loads.
package indexer
