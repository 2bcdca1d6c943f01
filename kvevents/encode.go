package kvevents

import (
	"errors"
	"fmt"

	"github.com/tinylib/msgp/msgp"
)

// AppendBatch appends the msgpack encoding of b to dst, as vLLM and SGLang
// encode it (msgspec rules, with msgpack-python's smallest integer widths
// and float64 timestamps), and returns the extended slice.
//
// The batch is [timestamp, events] when b.RankSlot is false and
// [timestamp, events, rank or nil] otherwise. Each event is encoded in its
// own Layout: LayoutArray writes the tag and the first Fields fields (up
// to kv_cache_spec_sliding_window, or group_idx in a BlockRemoved, when
// Fields is zero) with nil for unset values, in the order of the fields
// and metadata tail DecodeBatch reads (source_kind, which it does not
// keep, as nil; block_mm_infos, which has no place in that order, not at
// all); LayoutMap writes "type", then the fields without a default
// (always) and the defaulted fields that are set, in vLLM's declaration
// order.
//
// Re-encoding a decoded batch gives a batch that decodes to the same value
// (DecodeBatch(AppendBatch(b)) equals b), not always the same bytes: the
// output uses the smallest msgpack headers (except the map16 header of
// events decoded with one, see EngineEvent.WideMap), drops unknown map
// keys and array fields beyond the known ones, writes map keys in vLLM's
// declaration order (SGLang declares cache_salt before lora_name and omits
// a nil medium) and keeps no batch element beyond the third. vLLM's
// batches re-encode byte for byte (checked on batches captured from
// vLLM 0.33's publisher).
//
// It returns an error for an event of an unknown type or an array layout
// with more fields than the type has.
func AppendBatch(dst []byte, b *Batch) ([]byte, error) {
	if b.RankSlot {
		dst = msgp.AppendArrayHeader(dst, 3)
	} else {
		dst = msgp.AppendArrayHeader(dst, 2)
	}
	dst = msgp.AppendFloat64(dst, b.Timestamp)
	dst = msgp.AppendArrayHeader(dst, uint32(len(b.Events)))
	for i := range b.Events {
		var err error
		if dst, err = AppendEvent(dst, &b.Events[i]); err != nil {
			return dst, fmt.Errorf("event %d: %w", i, err)
		}
	}
	if b.RankSlot {
		dst = appendOptInt(dst, b.DPRank)
	}
	return dst, nil
}

// ErrEncode is wrapped by encoding errors: the value cannot be encoded as
// asked.
var ErrEncode = errors.New("kvevents: cannot encode")

// AppendEvent appends the msgpack encoding of one event (see AppendBatch).
func AppendEvent(dst []byte, ev *EngineEvent) ([]byte, error) {
	var fields []field
	var n, prefix int // the fields written when ev.Fields is zero; the fixed ones
	switch ev.Type {
	case BlockStored:
		fields, n, prefix = storedArrayFields[:], StoredFieldsAll, storedArrayPrefix
	case BlockRemoved:
		fields, n, prefix = removedArrayFields[:], RemovedFieldsAll, removedArrayPrefix
	case AllBlocksCleared:
		fields, prefix = clearedArrayFields[:], len(clearedArrayFields)
	default:
		return dst, fmt.Errorf("%w: event type %d", ErrEncode, ev.Type)
	}
	if ev.Layout == LayoutMap {
		return appendMapEvent(dst, ev), nil
	}
	if ev.Fields != 0 {
		if ev.Fields > len(fields) {
			return dst, fmt.Errorf("%w: %s with %d array fields, the type has %d", ErrEncode, ev.Type, ev.Fields, len(fields))
		}
		n = ev.Fields
	}
	// A metadata field that is set is written even past Fields: the tail
	// of a decoded event may have been read by type, not by position.
	for i := max(n, prefix); i < len(fields); i++ {
		if f := fields[i]; f != fUnknown && fieldSet(f, ev) {
			n = i + 1
		}
	}
	dst = msgp.AppendArrayHeader(dst, uint32(n+1))
	dst = msgp.AppendString(dst, ev.Type.String())
	for _, f := range fields[:n] {
		dst = appendField(dst, f, ev)
	}
	return dst, nil
}

// Map-layout field lists in declaration order; the flag says the field has
// no default and is always written.
type mapField struct {
	f        field
	name     string
	required bool
}

var (
	storedMapFields = []mapField{
		{fBlockHashes, "block_hashes", true},
		{fParent, "parent_block_hash", true},
		{fTokenIDs, "token_ids", true},
		{fBlockSize, "block_size", true},
		{fLoRAID, "lora_id", true},
		{fMedium, "medium", true},
		{fLoRAName, "lora_name", true},
		{fExtraKeys, "extra_keys", false},
		{fGroupIdx, "group_idx", false},
		{fSpecKind, "kv_cache_spec_kind", false},
		{fSlidingWindow, "kv_cache_spec_sliding_window", false},
		{fLocality, "locality", false},
		{fOwnership, "ownership", false},
		{fSessionID, "session_id", false},
		{fCacheSalt, "cache_salt", false},
		{fLookahead, "lookahead_token_ids", false},
		{fBlockMMInfos, "block_mm_infos", false},
	}
	removedMapFields = []mapField{
		{fBlockHashes, "block_hashes", true},
		{fMedium, "medium", true},
		{fGroupIdx, "group_idx", false},
		{fLocality, "locality", false},
		{fOwnership, "ownership", false},
	}
)

func appendMapEvent(dst []byte, ev *EngineEvent) []byte {
	var fields []mapField
	switch ev.Type {
	case BlockStored:
		fields = storedMapFields
	case BlockRemoved:
		fields = removedMapFields
	}
	n := 1
	for _, mf := range fields {
		if mf.required || fieldSet(mf.f, ev) {
			n++
		}
	}
	if ev.WideMap && n < 1<<16 {
		dst = append(dst, 0xde, byte(n>>8), byte(n))
	} else {
		dst = msgp.AppendMapHeader(dst, uint32(n))
	}
	dst = msgp.AppendString(dst, "type")
	dst = msgp.AppendString(dst, ev.Type.String())
	for _, mf := range fields {
		if mf.required || fieldSet(mf.f, ev) {
			dst = msgp.AppendString(dst, mf.name)
			dst = appendField(dst, mf.f, ev)
		}
	}
	return dst
}

// fieldSet reports whether a defaulted field differs from its default (nil).
func fieldSet(f field, ev *EngineEvent) bool {
	switch f {
	case fExtraKeys:
		return ev.ExtraKeys != nil
	case fGroupIdx:
		return ev.GroupIdx.Valid
	case fSpecKind:
		return ev.SpecKind != ""
	case fSlidingWindow:
		return ev.SlidingWindow.Valid
	case fLocality:
		return ev.Locality != ""
	case fOwnership:
		return ev.Ownership != ""
	case fSessionID:
		return ev.SessionID != ""
	case fCacheSalt:
		return ev.CacheSalt != ""
	case fLookahead:
		return ev.LookaheadTokenIDs != nil
	case fBlockMMInfos:
		return ev.BlockMMInfos != nil
	}
	return true
}

func appendField(dst []byte, f field, ev *EngineEvent) []byte {
	switch f {
	case fBlockHashes:
		dst = msgp.AppendArrayHeader(dst, uint32(len(ev.BlockHashes)))
		for _, h := range ev.BlockHashes {
			dst = AppendHash(dst, h)
		}
		return dst
	case fParent:
		return AppendHash(dst, ev.ParentBlockHash)
	case fTokenIDs:
		if ev.Eagle && len(ev.TokenIDs) > 0 {
			n := len(ev.TokenIDs) - 1
			dst = msgp.AppendArrayHeader(dst, uint32(n))
			for i := range n {
				dst = msgp.AppendArrayHeader(dst, 2)
				dst = msgp.AppendUint32(dst, ev.TokenIDs[i])
				dst = msgp.AppendUint32(dst, ev.TokenIDs[i+1])
			}
			return dst
		}
		dst = msgp.AppendArrayHeader(dst, uint32(len(ev.TokenIDs)))
		for _, t := range ev.TokenIDs {
			dst = msgp.AppendUint32(dst, t)
		}
		return dst
	case fBlockSize:
		return appendInt(dst, int64(ev.BlockSize))
	case fLoRAID:
		return appendOptInt(dst, ev.LoRAID)
	case fMedium:
		return appendOptString(dst, ev.Medium)
	case fLoRAName:
		if ev.SaltMetadata && ev.Layout == LayoutArray {
			dst = msgp.AppendMapHeader(dst, 1)
			dst = msgp.AppendString(dst, "cache_salt")
			return msgp.AppendString(dst, ev.CacheSalt)
		}
		return appendOptString(dst, ev.LoRAName)
	case fExtraKeys:
		if ev.ExtraKeys == nil {
			return msgp.AppendNil(dst)
		}
		return append(dst, ev.ExtraKeys...)
	case fLookahead:
		if ev.LookaheadTokenIDs == nil {
			return msgp.AppendNil(dst)
		}
		return append(dst, ev.LookaheadTokenIDs...)
	case fBlockMMInfos:
		if ev.BlockMMInfos == nil {
			return msgp.AppendNil(dst)
		}
		return append(dst, ev.BlockMMInfos...)
	case fGroupIdx:
		return appendOptInt(dst, ev.GroupIdx)
	case fSpecKind:
		return appendOptString(dst, ev.SpecKind)
	case fSlidingWindow:
		return appendOptInt(dst, ev.SlidingWindow)
	case fLocality:
		return appendOptString(dst, ev.Locality)
	case fOwnership:
		return appendOptString(dst, ev.Ownership)
	case fSessionID:
		return appendOptString(dst, ev.SessionID)
	case fCacheSalt:
		return appendOptString(dst, ev.CacheSalt)
	}
	return msgp.AppendNil(dst)
}

// AppendHash appends one block hash in its wire form (nil for HashNone).
func AppendHash(dst []byte, h Hash) []byte {
	switch h.Kind {
	case HashUint:
		return msgp.AppendUint64(dst, h.Key)
	case HashInt:
		return appendInt(dst, int64(h.Key))
	case HashBytes:
		return msgp.AppendBytes(dst, h.Bytes)
	}
	return msgp.AppendNil(dst)
}

// appendInt writes an integer as msgpack-python does: unsigned formats for
// non-negative values, signed ones for negative values.
func appendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return msgp.AppendUint64(dst, uint64(v))
	}
	return msgp.AppendInt64(dst, v)
}

func appendOptInt(dst []byte, v OptInt) []byte {
	if !v.Valid {
		return msgp.AppendNil(dst)
	}
	return appendInt(dst, v.Value)
}

func appendOptString(dst []byte, s string) []byte {
	if s == "" {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendString(dst, s)
}
