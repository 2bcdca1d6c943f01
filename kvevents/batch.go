package kvevents

import "fmt"

// EventType is the tag of an engine KV event (the msgspec class name).
type EventType uint8

// The engine event types vLLM and SGLang publish.
const (
	// BlockStored reports blocks newly cached, each the child of the one
	// before it, the first the child of ParentBlockHash.
	BlockStored EventType = iota + 1
	// BlockRemoved reports blocks evicted from Medium.
	BlockRemoved
	// AllBlocksCleared reports that the engine dropped its whole cache.
	AllBlocksCleared
)

// String returns the wire tag of the type.
func (t EventType) String() string {
	switch t {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// EventLayout is how an event struct is laid out on the wire.
type EventLayout uint8

// The event layouts msgspec produces.
const (
	// LayoutArray is msgspec's array_like=True: [tag, field1, field2, ...]
	// in declaration order (vLLM before vllm-project/vllm#42892, SGLang).
	LayoutArray EventLayout = iota
	// LayoutMap is a tagged map with omit_defaults: {"type": tag, ...}
	// (vLLM from vllm-project/vllm#42892 on, newer SGLang).
	LayoutMap
)

// Field counts (after the tag) of the array layouts producers have used.
// EngineEvent.Fields takes one of them, or another count up to the Max
// ones; zero means StoredFieldsAll or RemovedFieldsAll.
const (
	// StoredFieldsV09 is vLLM v0.9's BlockStored: up to lora_id.
	StoredFieldsV09 = 5
	// StoredFieldsMedium is vLLM ~v0.10's and SGLang's BlockStored: up to medium.
	StoredFieldsMedium = 6
	// StoredFieldsAll is the newest array BlockStored: up to
	// kv_cache_spec_sliding_window.
	StoredFieldsAll = 11
	// RemovedFieldsV09 is vLLM v0.9's BlockRemoved: block_hashes only.
	RemovedFieldsV09 = 1
	// RemovedFieldsMedium is SGLang's BlockRemoved: block_hashes, medium.
	RemovedFieldsMedium = 2
	// RemovedFieldsAll is the newest array BlockRemoved: up to group_idx.
	RemovedFieldsAll = 3
	// StoredFieldsMax and RemovedFieldsMax are the longest array layouts
	// kvevents reads and writes: the fixed fields and the whole metadata
	// tail, up to source_kind (see DecodeBatch). Fields after them are
	// skipped.
	StoredFieldsMax  = 13
	RemovedFieldsMax = 7
)

// OptInt is an integer field that may be nil or absent.
type OptInt struct {
	Value int64
	Valid bool // false: nil or absent
}

// Some returns a set OptInt.
func Some(v int64) OptInt { return OptInt{Value: v, Valid: true} }

// EngineEvent is one vLLM or SGLang KV event with every field those engines
// send. Fields a type does not have stay zero; optional strings are empty
// when nil or absent.
//
// A decoded event's slices point into its Batch (and Hash.Bytes and
// ExtraKeys into the payload): they are valid until the Batch is reused.
type EngineEvent struct {
	// Type is the event's tag.
	Type EventType
	// Layout is the wire layout the event came in (or is encoded in).
	Layout EventLayout
	// Fields is the number of array-layout fields after the tag that were
	// on the wire (or are to be encoded; zero means StoredFieldsAll or
	// RemovedFieldsAll). It is zero for map-layout events.
	Fields int
	// WideMap reports that a map-layout event came with a map16 header
	// although it has fewer than 16 entries, as msgspec writes structs
	// that declare more than 15 fields (vLLM's BlockStored from 0.33 on);
	// the encoder then writes one too.
	WideMap bool

	// BlockHashes are the stored or removed blocks' hashes.
	BlockHashes []Hash
	// ParentBlockHash precedes BlockHashes[0] (BlockStored); HashNone for
	// a root.
	ParentBlockHash Hash
	// TokenIDs are the tokens of exactly the stored blocks. When Eagle is
	// set they are followed by one more token: the second of the last pair.
	TokenIDs []uint32
	// Eagle reports that token_ids came as SGLang's Eagle bigram pairs
	// [t, t+1]: TokenIDs then holds the first token of each pair and the
	// second token of the last pair (Dynamo's is_eagle rule), and blocks
	// are hashed over BlockSize+1 tokens. Pairs whose second token is not
	// the next pair's first are not representable.
	Eagle bool
	// BlockSize is the number of tokens per block (BlockStored).
	BlockSize int
	// LoRAID is vLLM's deprecated integer LoRA id.
	LoRAID OptInt
	// Medium is where the blocks live: "GPU", "CPU", "STORAGE",
	// "CPU_PINNED", "DISK", "EXTERNAL"; empty for nil, which means GPU.
	Medium string
	// LoRAName is the LoRA adapter name, empty for the base model.
	LoRAName string
	// ExtraKeys is the raw msgpack of extra_keys (one entry per block:
	// a tuple of LoRA name, multimodal identifiers, cache salt, prompt
	// embeddings digest; or nil), or nil when nil or absent.
	ExtraKeys []byte
	// GroupIdx is the KV-cache group of hybrid models.
	GroupIdx OptInt
	// SpecKind is kv_cache_spec_kind: "full_attention", "mla_attention",
	// "sliding_window", "sliding_window_mla", "mamba", ... (see
	// ConverterConfig.ReuseKinds).
	SpecKind string
	// SlidingWindow is kv_cache_spec_sliding_window.
	SlidingWindow OptInt
	// Locality, Ownership and SessionID are newer vLLM map-layout fields.
	Locality, Ownership, SessionID string
	// CacheSalt is SGLang's cache_salt: a map-layout field from SGLang
	// 0.5.20 on, or the salt of SaltMetadata.
	CacheSalt string
	// SaltMetadata reports that an array-layout BlockStored carried, in
	// the lora_name slot, the metadata map {"cache_salt": salt} that SGLang
	// 0.5.18 and 0.5.19 append to salted stores (BlockStoredWithMetadata);
	// CacheSalt holds the salt, LoRAName is empty, and the encoder writes
	// the map back.
	SaltMetadata bool
	// BlockMMInfos is the raw msgpack of block_mm_infos, the per-block
	// multimodal objects that Dynamo's TensorRT-LLM publisher sends in
	// vLLM-format map events instead of extra_keys: one entry per block,
	// nil or {"mm_objects": [{"mm_hash": u64, "offsets": [[start, end],
	// ...]}, ...]}; nil when nil or absent. See ParseBlockMMInfos.
	BlockMMInfos []byte
	// LookaheadTokenIDs is the raw msgpack of vLLM's lookahead_token_ids
	// (the tokens beyond each block its engine hash covers), or nil when
	// nil or absent. Block hashes computed by kvroute do not use them.
	LookaheadTokenIDs []byte
}

// Batch is one KV event batch: the payload frame of one ZMQ message.
// Decode into a Batch you reuse: its buffers are kept between calls.
type Batch struct {
	// Timestamp is the publisher's wall clock in seconds since the epoch.
	Timestamp float64
	// Events are the batch's events in order.
	Events []EngineEvent
	// DPRank is the data-parallel rank (vLLM's data_parallel_rank,
	// SGLang's attn_dp_rank). Not valid means nil or absent: rank 0.
	DPRank OptInt
	// RankSlot reports whether the batch array has the third (rank) slot,
	// which vLLM v0.9 and early SGLang lack.
	RankSlot bool
	// Skipped counts events of unknown types that were skipped.
	Skipped int
	// Invalid counts events that were skipped because they are not valid
	// events although the batch is well-formed (see DecodeBatch);
	// InvalidErr is the first one's error, nil when Invalid is 0.
	Invalid    int
	InvalidErr error

	hashes []Hash   // arena for BlockHashes
	tokens []uint32 // arena for TokenIDs
	spans  []span   // per event: where its slices lie in the arenas
	intern map[string]string
}

// span records an event's slices as arena offsets while the arenas grow.
type span struct{ h0, h1, t0, t1 int }

// Rank returns the batch's data-parallel rank, 0 when nil or absent.
func (b *Batch) Rank() int64 {
	if b.DPRank.Valid {
		return b.DPRank.Value
	}
	return 0
}

// Reset empties b, keeping its buffers.
func (b *Batch) Reset() {
	clear(b.Events)
	b.Events = b.Events[:0]
	b.Timestamp, b.DPRank, b.RankSlot, b.Skipped = 0, OptInt{}, false, 0
	b.Invalid, b.InvalidErr = 0, nil
	b.hashes = b.hashes[:0]
	b.tokens = b.tokens[:0]
	b.spans = b.spans[:0]
}
