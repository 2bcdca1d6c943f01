package router

import (
	"fmt"

	"github.com/kvroute/kvroute"
)

// Role is what a worker does in the serving pipeline.
type Role uint8

// The worker roles.
const (
	// RoleAggregated workers run prefill and decode of a request themselves.
	RoleAggregated Role = iota
	// RolePrefill workers compute prompts' KV blocks and hand them to a
	// decode worker (disaggregated serving).
	RolePrefill
	// RoleDecode workers receive prompts' KV blocks from a prefill worker
	// and generate the output.
	RoleDecode
)

// String returns the role's name.
func (r Role) String() string {
	switch r {
	case RoleAggregated:
		return "aggregated"
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// Worker describes one inference engine to the router. A host implements
// it once per engine type; the router reads it when the worker is added or
// updated (AddWorker, UpdateWorker), never on the Select path, so an
// implementation may be a plain struct.
//
// Identity: ID must be unique among the router's workers and stable for the
// engine's life; it is the id the engine's KV events carry (or the host's
// mapping of them). An engine that runs with data parallelism has
// DataParallelRanks > 1: each rank keeps its own KV cache and is routed to
// separately, as the cache domain kvroute.WorkerKey{ID, rank}.
//
// Load: the router tracks the requests it routed itself (see
// Decision.PrefillDone and Decision.Done). Engines that publish metrics
// (running and waiting requests, KV-cache utilisation) are reported with
// Router.Heartbeat, which also drives health. Static capacities come from
// the optional Capacity interface.
//
// Optional abilities are separate interfaces found by type assertion, so
// that adding one never breaks existing implementations: Capacity.
type Worker interface {
	// ID identifies the engine.
	ID() kvroute.WorkerID
	// DataParallelRanks is the number of data-parallel ranks, each a cache
	// domain of its own. Values below 1 mean 1.
	DataParallelRanks() int
	// BlockSize is the engine's KV block size in tokens; it must equal
	// the router's hasher block size.
	BlockSize() int
	// Role is the worker's part in the pipeline.
	Role() Role
}

// Capacity is an optional interface of a Worker that knows its limits.
// Cost functions, busy thresholds and the admission queue use them; zero
// values mean unknown.
type Capacity interface {
	// MaxBatchedTokens is the engine's token budget per forward pass
	// (vLLM max_num_batched_tokens).
	MaxBatchedTokens() int
	// MaxRequests is the number of sequences it runs at once (vLLM
	// max_num_seqs).
	MaxRequests() int
	// KVCapacityBlocks is the size of its KV cache in blocks, per rank.
	KVCapacityBlocks() int
}

// StaticWorker is a Worker (and Capacity) described by plain values, for
// hosts that know their engines from configuration.
type StaticWorker struct {
	WorkerID       kvroute.WorkerID
	Ranks          int
	Block          int
	WorkerRole     Role
	BatchedTokens  int
	Requests       int
	CapacityBlocks int
}

// ID implements Worker.
func (w StaticWorker) ID() kvroute.WorkerID { return w.WorkerID }

// DataParallelRanks implements Worker.
func (w StaticWorker) DataParallelRanks() int { return w.Ranks }

// BlockSize implements Worker.
func (w StaticWorker) BlockSize() int { return w.Block }

// Role implements Worker.
func (w StaticWorker) Role() Role { return w.WorkerRole }

// MaxBatchedTokens implements Capacity.
func (w StaticWorker) MaxBatchedTokens() int { return w.BatchedTokens }

// MaxRequests implements Capacity.
func (w StaticWorker) MaxRequests() int { return w.Requests }

// KVCapacityBlocks implements Capacity.
func (w StaticWorker) KVCapacityBlocks() int { return w.CapacityBlocks }
