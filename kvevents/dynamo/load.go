package dynamo

import (
	"math"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

// LoadReporter receives load reports; *router.Router is one.
type LoadReporter interface {
	Heartbeat(w kvroute.WorkerKey, load scheduling.Load) error
}

// LoadOf turns a worker's latest reports into a router load report. Either
// report may be nil (not received yet). capacity is the worker's KV cache
// in blocks (the model card's runtime_config.total_kv_blocks; zero when
// unknown) and blockSize its KV block size in tokens (zero when unknown).
//
// From forward-pass-metrics: ActiveRequests is the requests scheduled in
// the last step (prefill and decode), QueueDepth the requests queued,
// ActivePrefillTokens the prompt tokens scheduled and queued for prefill
// and, with blockSize, ActiveDecodeBlocks the decoding requests' KV tokens
// in blocks. From kv_metrics, when set: active_prefill_tokens and
// active_decode_blocks replace those two, and kv_used_blocks over capacity
// is KVUtilization (at most 1).
func LoadOf(active *ActiveLoad, pass *ForwardPassMetrics, capacity, blockSize int) scheduling.Load {
	l := scheduling.Load{KVCapacityBlocks: max(capacity, 0)}
	if pass != nil {
		s, q := &pass.Scheduled, &pass.Queued
		l.ActiveRequests = clampInt(s.PrefillRequests, s.DecodeRequests)
		l.QueueDepth = clampInt(q.PrefillRequests, q.DecodeRequests)
		l.ActivePrefillTokens = clampInt(s.PrefillTokens, q.PrefillTokens)
		if blockSize > 0 {
			l.ActiveDecodeBlocks = clampInt(s.DecodeKVTokens/uint64(blockSize), min(s.DecodeKVTokens%uint64(blockSize), 1))
		}
	}
	if active != nil {
		if active.ActivePrefillTokens.Valid {
			l.ActivePrefillTokens = clampInt(active.ActivePrefillTokens.Value, 0)
		}
		if active.ActiveDecodeBlocks.Valid {
			l.ActiveDecodeBlocks = clampInt(active.ActiveDecodeBlocks.Value, 0)
		}
		if active.KVUsedBlocks.Valid && capacity > 0 {
			l.KVUtilization = min(float64(active.KVUsedBlocks.Value)/float64(capacity), 1)
		}
	}
	l.PotentialDecodeBlocks = l.ActiveDecodeBlocks
	return l
}

// clampInt adds two counts from the network without overflowing int.
func clampInt(a, b uint64) int {
	const limit = math.MaxInt32
	if a > limit || b > limit || a+b > limit {
		return limit
	}
	return int(a + b)
}
