package dynamo

import (
	"fmt"
	"math"
	"strconv"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute"
)

// OptUint is an optional unsigned count (a Rust Option<u64>: msgpack nil
// when absent).
type OptUint struct {
	Value uint64
	Valid bool
}

// ActiveLoad is the "kv_metrics" payload: Dynamo's ActiveLoad, which a
// worker publishes whenever its KV usage changes.
type ActiveLoad struct {
	// WorkerID is worker_id, the worker's instance id.
	WorkerID uint64
	// DPRank is dp_rank.
	DPRank uint32
	// ActiveDecodeBlocks is active_decode_blocks: the KV blocks the
	// worker's running requests hold, as the scheduler counts them.
	ActiveDecodeBlocks OptUint
	// ActivePrefillTokens is active_prefill_tokens: prompt tokens still to
	// prefill.
	ActivePrefillTokens OptUint
	// KVUsedBlocks is kv_used_blocks: the KV blocks in use.
	KVUsedBlocks OptUint
}

// DecodeActiveLoad decodes a "kv_metrics" payload into l. Unknown fields
// are skipped; worker_id is required. Errors wrap ErrMalformed.
func DecodeActiveLoad(p []byte, l *ActiveLoad) error {
	*l = ActiveLoad{}
	var have bool
	rest, err := readMap(p, "active load", func(key, p []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "worker_id":
			l.WorkerID, p, err = readWorkerID(p)
			have = err == nil
		case "dp_rank":
			l.DPRank, p, err = msgp.ReadUint32Bytes(p)
		case "active_decode_blocks":
			l.ActiveDecodeBlocks, p, err = readOptUint(p)
		case "active_prefill_tokens":
			l.ActivePrefillTokens, p, err = readOptUint(p)
		case "kv_used_blocks":
			l.KVUsedBlocks, p, err = readOptUint(p)
		default:
			return msgp.Skip(p)
		}
		return p, err
	})
	return finish(rest, err, have, "active load")
}

// AppendActiveLoad appends l encoded as Dynamo encodes an ActiveLoad.
func AppendActiveLoad(dst []byte, l *ActiveLoad) []byte {
	dst = msgp.AppendMapHeader(dst, 5)
	dst = msgp.AppendString(dst, "worker_id")
	dst = msgp.AppendUint64(dst, l.WorkerID)
	dst = msgp.AppendString(dst, "dp_rank")
	dst = msgp.AppendUint32(dst, l.DPRank)
	dst = msgp.AppendString(dst, "active_decode_blocks")
	dst = appendOptUint(dst, l.ActiveDecodeBlocks)
	dst = msgp.AppendString(dst, "active_prefill_tokens")
	dst = appendOptUint(dst, l.ActivePrefillTokens)
	dst = msgp.AppendString(dst, "kv_used_blocks")
	return appendOptUint(dst, l.KVUsedBlocks)
}

// RequestStats is one half of ForwardPassMetrics: the requests scheduled
// in the step (scheduled_requests) or waiting in the engine's queue
// (queued_requests).
type RequestStats struct {
	// PrefillRequests is num_prefill_requests.
	PrefillRequests uint64
	// PrefillTokens is sum_prefill_tokens: prompt tokens to prefill.
	PrefillTokens uint64
	// PrefillKVTokens is sum_prefill_kv_tokens (scheduled only): tokens
	// already in the KV cache of the prefilling requests.
	PrefillKVTokens uint64
	// DecodeRequests is num_decode_requests.
	DecodeRequests uint64
	// DecodeKVTokens is sum_decode_kv_tokens: the KV tokens the decoding
	// requests hold.
	DecodeKVTokens uint64
	// VarPrefillLength and VarDecodeKVTokens are var_prefill_length and
	// var_decode_kv_tokens.
	VarPrefillLength, VarDecodeKVTokens float64
}

// ForwardPassMetrics is the "forward-pass-metrics" payload, which a worker
// publishes after each engine step and once a second when idle.
type ForwardPassMetrics struct {
	// Version is version (1 in Dynamo 1.6.1).
	Version uint32
	// WorkerID is worker_id, sent as a decimal string.
	WorkerID uint64
	// DPRank is dp_rank.
	DPRank uint32
	// CounterID is counter_id: the step counter.
	CounterID uint64
	// WallTime is wall_time: the step's duration in seconds (0 when idle).
	WallTime float64
	// Scheduled is scheduled_requests; Queued is queued_requests.
	Scheduled, Queued RequestStats
}

// DecodeForwardPassMetrics decodes a "forward-pass-metrics" payload into
// m. Unknown fields are skipped; worker_id is required. Errors wrap
// ErrMalformed.
func DecodeForwardPassMetrics(p []byte, m *ForwardPassMetrics) error {
	*m = ForwardPassMetrics{}
	var have bool
	rest, err := readMap(p, "forward pass metrics", func(key, p []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "version":
			m.Version, p, err = msgp.ReadUint32Bytes(p)
		case "worker_id":
			m.WorkerID, p, err = readWorkerID(p)
			have = err == nil
		case "dp_rank":
			m.DPRank, p, err = msgp.ReadUint32Bytes(p)
		case "counter_id":
			m.CounterID, p, err = msgp.ReadUint64Bytes(p)
		case "wall_time":
			m.WallTime, p, err = readFloat(p)
		case "scheduled_requests":
			return readRequestStats(p, &m.Scheduled)
		case "queued_requests":
			return readRequestStats(p, &m.Queued)
		default:
			return msgp.Skip(p)
		}
		return p, err
	})
	return finish(rest, err, have, "forward pass metrics")
}

// AppendForwardPassMetrics appends m encoded as Dynamo encodes it.
func AppendForwardPassMetrics(dst []byte, m *ForwardPassMetrics) []byte {
	dst = msgp.AppendMapHeader(dst, 7)
	dst = msgp.AppendString(dst, "version")
	dst = msgp.AppendUint32(dst, m.Version)
	dst = msgp.AppendString(dst, "worker_id")
	dst = msgp.AppendString(dst, strconv.FormatUint(m.WorkerID, 10))
	dst = msgp.AppendString(dst, "dp_rank")
	dst = msgp.AppendUint32(dst, m.DPRank)
	dst = msgp.AppendString(dst, "counter_id")
	dst = msgp.AppendUint64(dst, m.CounterID)
	dst = msgp.AppendString(dst, "wall_time")
	dst = msgp.AppendFloat64(dst, m.WallTime)
	dst = msgp.AppendString(dst, "scheduled_requests")
	dst = appendRequestStats(dst, &m.Scheduled, true)
	dst = msgp.AppendString(dst, "queued_requests")
	return appendRequestStats(dst, &m.Queued, false)
}

func appendRequestStats(dst []byte, s *RequestStats, scheduled bool) []byte {
	n := uint32(6)
	if scheduled {
		n++
	}
	dst = msgp.AppendMapHeader(dst, n)
	dst = msgp.AppendString(dst, "num_prefill_requests")
	dst = msgp.AppendUint64(dst, s.PrefillRequests)
	dst = msgp.AppendString(dst, "sum_prefill_tokens")
	dst = msgp.AppendUint64(dst, s.PrefillTokens)
	dst = msgp.AppendString(dst, "var_prefill_length")
	dst = msgp.AppendFloat64(dst, s.VarPrefillLength)
	if scheduled {
		dst = msgp.AppendString(dst, "sum_prefill_kv_tokens")
		dst = msgp.AppendUint64(dst, s.PrefillKVTokens)
	}
	dst = msgp.AppendString(dst, "num_decode_requests")
	dst = msgp.AppendUint64(dst, s.DecodeRequests)
	dst = msgp.AppendString(dst, "sum_decode_kv_tokens")
	dst = msgp.AppendUint64(dst, s.DecodeKVTokens)
	dst = msgp.AppendString(dst, "var_decode_kv_tokens")
	return msgp.AppendFloat64(dst, s.VarDecodeKVTokens)
}

func readRequestStats(p []byte, s *RequestStats) ([]byte, error) {
	return readMap(p, "request stats", func(key, p []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "num_prefill_requests":
			s.PrefillRequests, p, err = msgp.ReadUint64Bytes(p)
		case "sum_prefill_tokens":
			s.PrefillTokens, p, err = msgp.ReadUint64Bytes(p)
		case "sum_prefill_kv_tokens":
			s.PrefillKVTokens, p, err = msgp.ReadUint64Bytes(p)
		case "num_decode_requests":
			s.DecodeRequests, p, err = msgp.ReadUint64Bytes(p)
		case "sum_decode_kv_tokens":
			s.DecodeKVTokens, p, err = msgp.ReadUint64Bytes(p)
		case "var_prefill_length":
			s.VarPrefillLength, p, err = readFloat(p)
		case "var_decode_kv_tokens":
			s.VarDecodeKVTokens, p, err = readFloat(p)
		default:
			return msgp.Skip(p)
		}
		return p, err
	})
}

// readWorkerID reads a worker id sent as an integer or, as Python
// publishers send it, a decimal string.
func readWorkerID(p []byte) (uint64, []byte, error) {
	if msgp.NextType(p) != msgp.StrType {
		return msgp.ReadUint64Bytes(p)
	}
	s, o, err := msgp.ReadStringZC(p)
	if err != nil {
		return 0, o, err
	}
	v, err := strconv.ParseUint(string(s), 10, 64)
	return v, o, err
}

func readOptUint(p []byte) (OptUint, []byte, error) {
	if msgp.IsNil(p) {
		return OptUint{}, p[1:], nil
	}
	v, o, err := msgp.ReadUint64Bytes(p)
	return OptUint{Value: v, Valid: err == nil}, o, err
}

func appendOptUint(dst []byte, v OptUint) []byte {
	if !v.Valid {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendUint64(dst, v.Value)
}

// readFloat reads a float (32 or 64 bits) or an integer as float64,
// refusing NaN and infinities.
func readFloat(p []byte) (float64, []byte, error) {
	var v float64
	var o []byte
	var err error
	switch msgp.NextType(p) {
	case msgp.Float64Type, msgp.Float32Type:
		v, o, err = msgp.ReadFloat64Bytes(p)
	case msgp.UintType:
		var u uint64
		u, o, err = msgp.ReadUint64Bytes(p)
		v = float64(u)
	default:
		var i int64
		i, o, err = msgp.ReadInt64Bytes(p)
		v = float64(i)
	}
	if err == nil && (math.IsNaN(v) || math.IsInf(v, 0)) {
		err = fmt.Errorf("non-finite number %v", v)
	}
	return v, o, err
}

func finish(rest []byte, err error, have bool, what string) error {
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: %d bytes after the %s", ErrMalformed, len(rest), what)
	}
	if !have {
		return fmt.Errorf("%w: %s without worker_id", ErrMalformed, what)
	}
	return nil
}

// Worker returns the cache domain the report is about.
func (l *ActiveLoad) Worker() kvroute.WorkerKey {
	return kvroute.WorkerKey{ID: kvroute.WorkerID(l.WorkerID), Rank: kvroute.DPRank(l.DPRank)}
}

// Worker returns the cache domain the report is about.
func (m *ForwardPassMetrics) Worker() kvroute.WorkerKey {
	return kvroute.WorkerKey{ID: kvroute.WorkerID(m.WorkerID), Rank: kvroute.DPRank(m.DPRank)}
}
