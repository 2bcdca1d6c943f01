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
//     *UnknownParentError means the worker's view is incomplete, and a
//     *RepeatedBlockError that the engine sent a chain naming one block
//     hash twice, of which the index kept the part before the repeat.
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
// The index is a compressed radix tree. A run is a chain of blocks (each
// the child of the one before) stored at fixed positions in contiguous
// arrays: their chained sequence hashes, their own block hashes, and one
// reference per position to the position's holder set, a segment.
// Positions with the same holders in the same tiers share one segment, so
// a long prefix cached by the same workers is one segment: a request is
// matched by one table lookup for the run that holds its first block, then
// by comparing its sequence hashes with the run's in contiguous memory and
// reloading holder words only where the segment changes. The block table
// (sequence hash to run and position) holds only heads, the blocks a walk
// cannot reach from their parent's position: run starts. Match takes no
// lock: positions are written once before they are published, holder
// words are atomics, and a segment's words change in place only when all
// of its positions change together (other changes move the positions
// concerned to another segment).
//
// Segments live in an arena of fixed pages, and positions refer to them
// by arena slot and the slot's generation, not by pointer: runs hold no
// pointers, so the garbage collector never scans them and setting a
// position's segment is a plain store. A segment is freed when no
// position refers to it; freeing raises its slot's generation, so a
// reader that read the slot while it was given out again sees the
// generation changed and reads the position again.
//
// A block never moves while anyone holds it, so each worker's engine-hash
// map points straight at (run, position) and no write updates other
// workers' entries. When a worker stores or evicts part of a stretch, only
// the positions concerned change segment: an eviction in the middle of a
// chain drops that one position, and the blocks after it stay indexed (and
// become reachable again when the evicted block is stored again), which is
// exactly what the engine holds. Dead positions come back to life in place
// when their block is stored again under the same parent (a dead position
// is found from its live parent, or at a run start from the table, so an
// eviction mid-chain changes no table entry); dead run starts stay in the
// table for that while their run has live positions, and otherwise until
// there are many.
//
// Engines' own block hashes are opaque: each worker's map from engine
// hashes to blocks is an open-addressing table of pointer-free slots (key
// and packed entry side by side), so that storing, finding or removing a
// hash touches one cache line and the garbage collector never scans the
// maps. Worker identities are interned into dense
// slots; a segment holds one 64-bit word per tier for every 64 slots, so
// the holder set in a cluster of up to 64 cache domains is four words.
// Writes serialise on one mutex.
package indexer
