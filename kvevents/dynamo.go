package kvevents

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/kvroute/kvroute"
)

// ErrOtherResidency is wrapped by the error DynamoEvent.ToEvent returns for
// an event of another residency domain than its worker's own: the blocks
// of a cache owner (residency_domain "cache_owner", vLLM's blocks of
// ownership "kvcr" as Dynamo relays them) or of a domain kvevents does not
// know. They are not blocks the worker holds, and Dynamo's router does not
// index them as the worker's.
var ErrOtherResidency = errors.New("kvevents: event of another residency domain than the worker's")

// DynamoKind is the variant of a Dynamo KvCacheEventData.
type DynamoKind uint8

// The variants of Dynamo's KvCacheEventData (serde snake_case names).
const (
	DynamoStored  DynamoKind = iota + 1 // "stored"
	DynamoRemoved                       // "removed"
	DynamoCleared                       // "cleared"
)

// Dynamo's residency domains (ResidencyDomain, serde snake_case): the
// worker's own blocks, or a cache owner's.
const (
	ResidencyWorker     = "worker"
	ResidencyCacheOwner = "cache_owner"
)

// Dynamo's storage tier names (StorageTier, serde snake_case).
const (
	DynamoTierDevice     = "device"
	DynamoTierHostPinned = "host_pinned"
	DynamoTierDisk       = "disk"
	DynamoTierExternal   = "external"
)

// DynamoEvent is NVIDIA Dynamo's RouterEvent (ai-dynamo/dynamo
// lib/kv-router/src/protocols.rs) with its KvCacheEvent flattened in:
// what Dynamo's workers publish to its routers, as JSON (serde_json) or
// msgpack with field names (rmp_serde::to_vec_named).
//
// A decoded DynamoEvent's slices are reused by the next decode into it.
type DynamoEvent struct {
	// WorkerID is worker_id.
	WorkerID uint64
	// StorageTier is storage_tier: "device" (the default when absent),
	// "host_pinned", "disk" or "external".
	StorageTier string
	// ResidencyDomain is residency_domain (ResidencyWorker or
	// ResidencyCacheOwner), empty when absent (the worker's). ToEvent
	// refuses events of another domain than the worker's.
	ResidencyDomain string
	// EventID is event.event_id: the worker's event sequence number.
	EventID uint64
	// DPRank is event.dp_rank (default 0).
	DPRank uint32
	// Kind selects the event.data variant.
	Kind DynamoKind
	// HasParent and ParentHash are stored.parent_hash (null when absent).
	HasParent  bool
	ParentHash uint64
	// StartPosition is stored.start_position (null when not Valid).
	StartPosition OptInt
	// Blocks are stored.blocks.
	Blocks []DynamoBlock
	// Removed are removed.block_hashes.
	Removed []uint64
}

// DynamoBlock is Dynamo's KvCacheStoredBlockData.
type DynamoBlock struct {
	// BlockHash is block_hash: the engine's opaque hash (Dynamo's
	// ExternalSequenceBlockHash).
	BlockHash uint64
	// TokensHash is tokens_hash: XXH3-64 of the block's tokens, seed 1337
	// (plus the LoRA offset): a kvroute.BlockHash.
	TokensHash uint64
	// MMObjects is mm_extra_info.mm_objects; MMInfo reports whether
	// mm_extra_info was set (not null).
	MMInfo    bool
	MMObjects []DynamoMMObject
}

// DynamoMMObject is Dynamo's BlockMMObjectInfo: a multimodal object's hash
// and the [start, end) token ranges it covers in the block.
type DynamoMMObject struct {
	MMHash  uint64      `json:"mm_hash"`
	Offsets [][2]uint64 `json:"offsets"`
}

// TierOfDynamo maps Dynamo's storage tier names to tiers; empty is
// "device" (serde's default) and unknown names are TierExternal.
func TierOfDynamo(s string) kvroute.Tier {
	switch s {
	case "", DynamoTierDevice:
		return kvroute.TierDevice
	case DynamoTierHostPinned:
		return kvroute.TierHost
	case DynamoTierDisk:
		return kvroute.TierDisk
	}
	return kvroute.TierExternal
}

// DynamoTierName is the inverse of TierOfDynamo.
func DynamoTierName(t kvroute.Tier) string {
	switch t {
	case kvroute.TierHost:
		return DynamoTierHostPinned
	case kvroute.TierDisk:
		return DynamoTierDisk
	case kvroute.TierExternal:
		return DynamoTierExternal
	}
	return DynamoTierDevice
}

// ToEvent converts d into out, reusing out's Blocks and Removed slices.
//
// The worker is (worker_id, dp_rank) and the tier comes from storage_tier.
// Dynamo numbers events from 0 while kvroute reserves ID 0 for unsequenced
// events, so out.ID = event_id + 1 (wrapping: event_id 2^64-1, which
// FromEvent writes for an unsequenced event, becomes ID 0). Stored blocks
// get External = block_hash and Hash = tokens_hash, without tokens.
//
// It returns an error wrapping ErrOtherResidency, and leaves out as it
// is, for an event whose residency_domain is set to another value than
// "worker": skip it.
func (d *DynamoEvent) ToEvent(out *kvroute.Event) error {
	if d.ResidencyDomain != "" && d.ResidencyDomain != ResidencyWorker {
		return fmt.Errorf("%w: residency_domain %q", ErrOtherResidency, d.ResidencyDomain)
	}
	*out = kvroute.Event{
		Worker:  kvroute.WorkerKey{ID: kvroute.WorkerID(d.WorkerID), Rank: kvroute.DPRank(d.DPRank)},
		ID:      d.EventID + 1,
		Tier:    TierOfDynamo(d.StorageTier),
		Blocks:  out.Blocks[:0],
		Removed: out.Removed[:0],
	}
	switch d.Kind {
	case DynamoStored:
		out.Kind = kvroute.EventStored
		out.HasParent, out.Parent = d.HasParent, kvroute.ExternalHash(d.ParentHash)
		for _, b := range d.Blocks {
			out.Blocks = append(out.Blocks, kvroute.StoredBlock{
				External: kvroute.ExternalHash(b.BlockHash),
				Hash:     kvroute.BlockHash(b.TokensHash),
			})
		}
	case DynamoRemoved:
		out.Kind = kvroute.EventRemoved
		for _, h := range d.Removed {
			out.Removed = append(out.Removed, kvroute.ExternalHash(h))
		}
	case DynamoCleared:
		out.Kind = kvroute.EventCleared
	default:
		return fmt.Errorf("%w: dynamo event kind %d", ErrInvalidEvent, d.Kind)
	}
	return nil
}

// FromEvent sets d from ev, reusing d's slices; the inverse of ToEvent.
// Stored blocks that carry Tokens are hashed with h.WithLoRA(ev.LoRA) (h
// may be the zero Hasher when no block carries tokens). An event of
// sequence hashes (kvroute.Event.SeqHashes) is refused with an error
// wrapping ErrEncode: a RouterEvent has no way to say so.
func (d *DynamoEvent) FromEvent(ev *kvroute.Event, h kvroute.Hasher) error {
	if err := ev.Validate(); err != nil {
		return err
	}
	if ev.SeqHashes {
		return fmt.Errorf("%w: a RouterEvent carries content hashes, not sequence hashes", ErrEncode)
	}
	*d = DynamoEvent{
		WorkerID:    uint64(ev.Worker.ID),
		StorageTier: DynamoTierName(ev.Tier),
		EventID:     ev.ID - 1,
		DPRank:      uint32(ev.Worker.Rank),
		Blocks:      d.Blocks[:0],
		Removed:     d.Removed[:0],
	}
	switch ev.Kind {
	case kvroute.EventStored:
		d.Kind = DynamoStored
		d.HasParent, d.ParentHash = ev.HasParent, uint64(ev.Parent)
		lh := h
		if ev.LoRA != "" && h.Valid() {
			lh = h.WithLoRA(ev.LoRA)
		}
		for _, b := range ev.Blocks {
			hash := b.Hash
			if len(b.Tokens) != 0 {
				if !lh.Valid() {
					return fmt.Errorf("%w: block with tokens and no hasher", ErrEncode)
				}
				hash = lh.HashBlock(b.Tokens)
			}
			d.Blocks = append(d.Blocks, DynamoBlock{BlockHash: uint64(b.External), TokensHash: uint64(hash)})
		}
	case kvroute.EventRemoved:
		d.Kind = DynamoRemoved
		for _, x := range ev.Removed {
			d.Removed = append(d.Removed, uint64(x))
		}
	case kvroute.EventCleared:
		d.Kind = DynamoCleared
	}
	return nil
}

// The JSON model of RouterEvent, as serde_json writes it.
type (
	dynamoJSON struct {
		WorkerID        uint64          `json:"worker_id"`
		StorageTier     string          `json:"storage_tier,omitempty"`
		ResidencyDomain string          `json:"residency_domain,omitempty"`
		Event           dynamoEventJSON `json:"event"`
	}
	dynamoEventJSON struct {
		EventID uint64          `json:"event_id"`
		Data    json.RawMessage `json:"data"`
		DPRank  uint32          `json:"dp_rank"`
	}
	dynamoStoredJSON struct {
		ParentHash    *uint64           `json:"parent_hash"`
		StartPosition *int64            `json:"start_position"`
		Blocks        []dynamoBlockJSON `json:"blocks"`
	}
	dynamoBlockJSON struct {
		BlockHash   uint64        `json:"block_hash"`
		TokensHash  uint64        `json:"tokens_hash"`
		MMExtraInfo *dynamoMMJSON `json:"mm_extra_info"`
	}
	dynamoMMJSON struct {
		MMObjects []DynamoMMObject `json:"mm_objects"`
	}
	dynamoRemovedJSON struct {
		BlockHashes []uint64 `json:"block_hashes"`
	}
)

// MarshalJSON encodes d as serde_json encodes a RouterEvent.
func (d *DynamoEvent) MarshalJSON() ([]byte, error) {
	j := dynamoJSON{
		WorkerID:        d.WorkerID,
		StorageTier:     d.StorageTier,
		ResidencyDomain: d.ResidencyDomain,
		Event:           dynamoEventJSON{EventID: d.EventID, DPRank: d.DPRank},
	}
	if j.StorageTier == "" {
		j.StorageTier = DynamoTierDevice
	}
	var err error
	switch d.Kind {
	case DynamoStored:
		s := dynamoStoredJSON{Blocks: make([]dynamoBlockJSON, len(d.Blocks))}
		if d.HasParent {
			s.ParentHash = &d.ParentHash
		}
		if d.StartPosition.Valid {
			s.StartPosition = &d.StartPosition.Value
		}
		for i, b := range d.Blocks {
			s.Blocks[i] = dynamoBlockJSON{BlockHash: b.BlockHash, TokensHash: b.TokensHash}
			if b.MMInfo {
				s.Blocks[i].MMExtraInfo = &dynamoMMJSON{MMObjects: b.MMObjects}
			}
		}
		j.Event.Data, err = json.Marshal(map[string]any{"stored": s})
	case DynamoRemoved:
		j.Event.Data, err = json.Marshal(map[string]any{"removed": dynamoRemovedJSON{BlockHashes: d.Removed}})
	case DynamoCleared:
		j.Event.Data = json.RawMessage(`"cleared"`)
	default:
		return nil, fmt.Errorf("%w: dynamo event kind %d", ErrEncode, d.Kind)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEncode, err)
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes a RouterEvent as serde_json writes it. Integers
// are read exactly (values above 2^53 included); unknown fields are
// ignored. Errors wrap ErrMalformed.
func (d *DynamoEvent) UnmarshalJSON(data []byte) error {
	var j dynamoJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return fmt.Errorf("%w: dynamo event: %w", ErrMalformed, err)
	}
	*d = DynamoEvent{
		WorkerID:        j.WorkerID,
		StorageTier:     j.StorageTier,
		ResidencyDomain: j.ResidencyDomain,
		EventID:         j.Event.EventID,
		DPRank:          j.Event.DPRank,
		Blocks:          d.Blocks[:0],
		Removed:         d.Removed[:0],
	}
	if d.StorageTier == "" {
		d.StorageTier = DynamoTierDevice
	}
	var unit string
	if err := json.Unmarshal(j.Event.Data, &unit); err == nil {
		if unit != "cleared" {
			return fmt.Errorf("%w: dynamo event data %q", ErrMalformed, unit)
		}
		d.Kind = DynamoCleared
		return nil
	}
	var variants struct {
		Stored  *dynamoStoredJSON  `json:"stored"`
		Removed *dynamoRemovedJSON `json:"removed"`
		// Not a pointer: {"cleared": null} (the map form of the unit
		// variant, which serde_json reads too) leaves it "null".
		Cleared json.RawMessage `json:"cleared"`
	}
	if err := json.Unmarshal(j.Event.Data, &variants); err != nil {
		return fmt.Errorf("%w: dynamo event data: %w", ErrMalformed, err)
	}
	switch {
	case variants.Stored != nil:
		s := variants.Stored
		d.Kind = DynamoStored
		if s.ParentHash != nil {
			d.HasParent, d.ParentHash = true, *s.ParentHash
		}
		if s.StartPosition != nil {
			if *s.StartPosition < 0 || *s.StartPosition > math.MaxUint32 {
				return fmt.Errorf("%w: start_position %d", ErrMalformed, *s.StartPosition)
			}
			d.StartPosition = Some(*s.StartPosition)
		}
		for _, b := range s.Blocks {
			db := DynamoBlock{BlockHash: b.BlockHash, TokensHash: b.TokensHash}
			if b.MMExtraInfo != nil {
				db.MMInfo, db.MMObjects = true, b.MMExtraInfo.MMObjects
			}
			d.Blocks = append(d.Blocks, db)
		}
	case variants.Removed != nil:
		d.Kind = DynamoRemoved
		d.Removed = append(d.Removed, variants.Removed.BlockHashes...)
	case len(variants.Cleared) != 0:
		d.Kind = DynamoCleared
	default:
		return fmt.Errorf("%w: dynamo event data has no known variant", ErrMalformed)
	}
	return nil
}
