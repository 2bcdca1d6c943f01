package kvroute

import "fmt"

// WorkerID identifies one inference engine instance, as the host names it.
// Dynamo uses the same 64-bit space for its worker (instance) ids.
type WorkerID uint64

// DPRank is a data-parallel rank inside one worker. Each rank of a worker
// that runs with data parallelism keeps its own KV cache, so the router
// treats every (worker, rank) pair as a cache domain of its own.
type DPRank uint32

// WorkerKey is the identity of one cache domain: a worker and one of its
// data-parallel ranks. The zero Rank is the only rank of a worker that runs
// without data parallelism. WorkerKey is comparable and is used as a map key.
type WorkerKey struct {
	ID   WorkerID
	Rank DPRank
}

// String formats the key as "id/rank".
func (k WorkerKey) String() string { return fmt.Sprintf("%d/%d", k.ID, k.Rank) }
