package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"slices"

	"github.com/kvroute/kvroute"
)

// ErrConfig is wrapped by configuration errors.
var ErrConfig = errors.New("kvevents: invalid configuration")

// ErrInvalidEvent is wrapped by conversion errors: an event that decoded
// but makes no sense (a block size or rank out of range). The batch should
// be dropped.
var ErrInvalidEvent = errors.New("kvevents: invalid event")

// Media the engines report, as they spell them.
const (
	MediumGPU       = "GPU"
	MediumCPU       = "CPU"
	MediumCPUPinned = "CPU_PINNED"
	MediumDisk      = "DISK"
	MediumStorage   = "STORAGE"
	MediumExternal  = "EXTERNAL"
	// The tiers of Dynamo's KV block manager, which publishes
	// vLLM-format events: G1 is "GPU", G2 (host memory) "CPU_TIER1",
	// G3 (local disk) "CPU_TIER2".
	MediumCPUTier1 = "CPU_TIER1"
	MediumCPUTier2 = "CPU_TIER2"
	// Further names Dynamo's router reads as tiers.
	MediumDevice = "DEVICE"
	MediumNVMe   = "NVME"
)

// TierOfMedium maps an engine's medium to a storage tier, reading the
// names Dynamo's router reads as it does:
//
//	"" (nil), "GPU", "DEVICE"             → TierDevice
//	"CPU", "CPU_PINNED", "CPU_TIER1"      → TierHost (host DRAM, pinned or not)
//	"DISK", "NVME", "CPU_TIER2"           → TierDisk
//	anything else                         → TierExternal ("STORAGE",
//	                                        "EXTERNAL", "NETWORK", "REMOTE",
//	                                        "SHARED", unknown)
//
// Matching is exact (engines send upper case). Unlike Dynamo, which puts
// an unknown medium on the device, an unknown medium is TierExternal: a
// block of an unknown tier is not counted as one the GPU holds.
func TierOfMedium(medium string) kvroute.Tier {
	switch medium {
	case "", MediumGPU, MediumDevice:
		return kvroute.TierDevice
	case MediumCPU, MediumCPUPinned, MediumCPUTier1:
		return kvroute.TierHost
	case MediumDisk, MediumNVMe, MediumCPUTier2:
		return kvroute.TierDisk
	}
	return kvroute.TierExternal
}

// MediumOfTier is the inverse of TierOfMedium for encoders: the canonical
// medium of each tier ("GPU", "CPU", "DISK", "EXTERNAL").
func MediumOfTier(t kvroute.Tier) string {
	switch t {
	case kvroute.TierHost:
		return MediumCPU
	case kvroute.TierDisk:
		return MediumDisk
	case kvroute.TierExternal:
		return MediumExternal
	}
	return MediumGPU
}

// SaltedNamespace returns kvroute.SaltedNamespace(namespace, salt): the
// hasher namespace of blocks stored under a cache salt.
func SaltedNamespace(namespace, salt string) string {
	return kvroute.SaltedNamespace(namespace, salt)
}

// The kv_cache_spec_kind values vLLM publishes (vllm/v1/kv_cache_interface.py
// KVCacheSpecKind).
const (
	KindFullAttention         = "full_attention"
	KindMLAAttention          = "mla_attention"
	KindSlidingWindow         = "sliding_window"
	KindSlidingWindowMLA      = "sliding_window_mla"
	KindMamba                 = "mamba"
	KindChunkedLocalAttention = "chunked_local_attention"
	KindSinkFullAttention     = "sink_full_attention"
	KindEncoderOnlyAttention  = "encoder_only_attention"
	KindCrossAttention        = "cross_attention"
)

// DefaultReuseKinds are the KV-cache group kinds whose blocks decide prefix
// reuse when ConverterConfig.ReuseKinds is nil: full attention, MLA and
// full attention with sinks (Dynamo's "main attention" kinds). A prefix is
// reusable only if these groups hold it; sliding-window, chunked-local and
// state-space (Mamba) groups keep only a suffix or a state, so their
// stores and evictions say nothing about prefix hits.
var DefaultReuseKinds = []string{KindFullAttention, KindMLAAttention, KindSinkFullAttention}

// ConverterConfig configures a Converter. The zero value converts events
// of worker 0, rank 0, with block size 16 and no namespace.
type ConverterConfig struct {
	// Worker is the id of the engine the events come from. The cache
	// domain of each event is (Worker, the batch's data-parallel rank).
	Worker kvroute.WorkerID
	// Rank is the data-parallel rank of batches that carry none (a nil or
	// absent rank): set it per subscriber when each rank of an engine
	// publishes on its own endpoint. Batches with a rank keep theirs.
	Rank kvroute.DPRank
	// BlockSize is the router's block size: every event is indexed in
	// blocks of this size. Zero means kvroute.DefaultBlockSize. See
	// RejectBlockSize for events of another size.
	BlockSize int
	// RejectBlockSize rejects (skips and counts) stored events whose
	// block_size differs from BlockSize. When false, events of a size that
	// divides BlockSize (SGLang's default page size 1, for instance) are
	// re-chunked into BlockSize blocks (see Converter); other sizes are
	// rejected all the same.
	RejectBlockSize bool
	// Namespace is the hasher namespace (kvroute.HasherConfig.Namespace)
	// the router uses for this model. Empty means none.
	Namespace string
	// LoRAs maps vLLM's deprecated integer lora_id to adapter names, for
	// producers that send no lora_name. A stored event with a lora_id not
	// in the table and no name is skipped and counted (never indexed as
	// the base model).
	LoRAs map[int64]string
	// ReuseKinds lists the kv_cache_spec_kind values of the KV-cache
	// groups that decide prefix reuse in hybrid models: only their events
	// add or remove blocks. Nil means DefaultReuseKinds.
	ReuseKinds []string
	// GroupKinds gives the kinds of KV-cache groups by group_idx, for
	// events that carry a group_idx and no kind (vLLM's BlockRemoved).
	// Kinds carried by stored events are learned per rank and override it.
	// An event of a group whose kind is unknown is converted for group 0
	// and skipped for any other group.
	GroupKinds map[int64]string
	// ExpectTierCopies makes the Converter remember the device blocks it
	// converts from the first event on, for engines that offload blocks
	// to another tier and report the copies without tokens (vLLM's CPU
	// offloading connector): see Converter. When false, it starts at the
	// first such copy, so that engines without offloading pay nothing,
	// and copies of device blocks stored before it are dropped.
	ExpectTierCopies bool
	// Logger receives debug records of skipped events, and a Warn record
	// of invalid events when they first come and each time their total
	// doubles. Nil discards.
	Logger *slog.Logger
}

// ConvertStats counts what conversion left out or changed. All fields only
// grow.
type ConvertStats struct {
	// SkippedEvents are events not converted for any reason below, and
	// stored events without a full block of tokens.
	SkippedEvents uint64
	// DroppedBlocks are stored block hashes without a full block of
	// token ids (including a partial last block).
	DroppedBlocks uint64
	// SkippedGroupEvents are events of KV-cache groups outside
	// ReuseKinds (or of unknown groups other than 0); SkippedGroupBlocks
	// counts their block hashes.
	SkippedGroupEvents, SkippedGroupBlocks uint64
	// BlockSizeRejects are stored events rejected for their block size.
	BlockSizeRejects uint64
	// Rechunked are stored events re-chunked into the router's block size.
	Rechunked uint64
	// UnknownLoRA are stored events with a lora_id missing from
	// ConverterConfig.LoRAs.
	UnknownLoRA uint64
	// InvalidEvents are events skipped because a field was unusable
	// (unreadable extra_keys, a block size out of range, block hashes that
	// repeat one another or the parent), including the events DecodeBatch
	// skipped as invalid (Batch.Invalid).
	InvalidEvents uint64
	// UnknownTypes are events of types kvevents does not know, which
	// DecodeBatch skipped (Batch.Skipped).
	UnknownTypes uint64
	// Salted are stored events hashed under a cache salt; MMBlocks are
	// blocks hashed with multimodal items.
	Salted, MMBlocks uint64
	// NotLocal are events skipped because they are about blocks the
	// engine does not hold itself: a locality other than "LOCAL", or an
	// ownership (vLLM's locality and ownership fields), as Dynamo skips
	// them. See Converter for what vLLM's ownership values mean.
	NotLocal uint64
	// TierCopies are stored events of a tier other than the device that
	// carried block hashes without tokens (vLLM's CPU offloading), whose
	// blocks were stored from what earlier device stores said of them
	// (see Converter); their blocks that no device store described are
	// counted in DroppedBlocks.
	TierCopies uint64
	// StateClears counts the times a bounded map of what the Converter
	// learned from earlier events (the kinds of KV-cache groups per rank,
	// the salts of salted blocks, re-chunking tails, device blocks'
	// identities for tier copies) reached its bound and was emptied;
	// what it held is learned again from later events.
	StateClears uint64
}

// Converter turns decoded engine batches into kvroute.Events, computing
// each stored block's kvroute.BlockHash from its token ids (the indexer's
// fast path: Hash set, Tokens nil) exactly as the router hashes prompts.
//
// Conversion rules:
//   - the worker is (Config.Worker, batch rank, or Config.Rank when the
//     batch has none); the event ID is 0 (the transport numbers events);
//   - the tier is TierOfMedium(event.Medium);
//   - a block's hash includes the event's LoRA adapter (lora_name, or
//     lora_id through Config.LoRAs), its cache salt (SGLang's cache_salt,
//     or the salt in vLLM's extra_keys; vLLM sends it with a chain's first
//     block only, so the salt of a stored parent carries over to its
//     children), its multimodal items (vLLM's extra_keys, see
//     ParseExtraKeys, or block_mm_infos, see ParseBlockMMInfos) and Eagle
//     windows (SGLang's bigram token pairs):
//     the same hash kvroute.Hasher gives a router.Request with that
//     LoRA, CacheSalt and MM;
//   - a stored event keeps the first min(len(block_hashes),
//     full blocks of token_ids) blocks: a partial last block is dropped;
//     an event left with no block is skipped;
//   - events of KV-cache groups whose kind is not in ReuseKinds are
//     skipped and counted (see ConverterConfig.GroupKinds);
//   - a stored event whose block_size differs from Config.BlockSize is
//     rejected and counted, unless it divides it and re-chunking is on:
//     then every BlockSize/block_size engine blocks make one block whose
//     External is the engine hash of its last engine block, and the tokens
//     left over at the end of an event are kept with the event's last
//     engine hash, so that a later event continuing from it completes the
//     block. A later event whose parent is another engine block of an
//     incomplete block cannot be aligned: its blocks refer to a parent
//     the index does not know, and the index rejects them;
//   - events with a locality other than "LOCAL" (a remote tier) or with
//     an ownership are skipped and counted (ConvertStats.NotLocal). vLLM
//     sets ownership only on the events of a secondary offloading tier
//     that holds blocks on its own behalf ("Secondary offloading tier
//     identifier", vllm/distributed/kv_events.py; OffloadingEvent in
//     vllm/v1/kv_offload/base.py); the engine's own tiers (the device, its
//     CPU offloading tier, its file-system and object tiers) publish none.
//     Up to vLLM 0.33 its one value is "kvcr" (vllm/v1/kv_offload/tiering/
//     kvcr/manager.py, _record_inventory): the inventory KVCR reports of
//     the DRAM it manages (medium "CPU": memory of its own service, or a
//     region it maps) and of its storage ("STORAGE"), held by KVCR rather
//     than by the engine's cache, which Dynamo takes as a cache owner's
//     blocks (residency domain "cache_owner"), not the worker's. Their
//     removals leave the engine's copies of the same blocks alone;
//   - a stored event whose block hashes repeat one another or its parent
//     (a block its own ancestor) is skipped and counted, as Dynamo skips
//     it;
//   - removed events keep every hash; AllBlocksCleared becomes
//     EventCleared.
//
// A stored event of another tier with block hashes and no tokens (vLLM's
// CPU offloading connector sends its stores so: token_ids [], no parent,
// block size 0) says only that copies of device blocks were made. From the
// first such event on (from the start with Config.ExpectTierCopies), the
// Converter remembers the parent and hash of the device blocks it
// converts (bounded; forgotten when the device copy is removed or the rank
// cleared), and converts such an event into the chains of its blocks it
// knows, on the event's tier; blocks it does not know are dropped and
// counted.
//
// Salts are carried along a chain by the engine hashes of salted blocks
// (forgotten when the device copy is removed or the rank cleared, and all
// at once when they reach their bound, 2^20 blocks). A stored event whose
// salted parent is not known (the subscriber joined in the middle of a
// chain) is hashed without a salt, as Dynamo does: it then matches nothing
// a salted request asks for.
//
// An event that cannot be converted is skipped and counted in Stats; the
// others of its batch are converted. Convert also counts the events
// DecodeBatch skipped (Batch.Skipped and Batch.Invalid).
//
// A Converter is not safe for concurrent use; use one per subscriber.
type Converter struct {
	cfg     ConverterConfig
	log     *slog.Logger
	base    kvroute.Hasher               // block size BlockSize, Namespace, no LoRA
	hashers map[hasherKey]kvroute.Hasher // LoRA, salt and Eagle variants, bounded
	reuse   map[string]bool
	kinds   map[groupKey]string     // learned kinds per rank and group
	salts   map[chainKey]string     // salted blocks' salts, for their children
	tails   map[chainKey]*chunkTail // re-chunking state at events' last blocks
	ids     map[chainKey]identity   // device blocks' identities, once a tier copy came
	free    []*chunkTail            // tails kept for reuse
	blocks  []kvroute.StoredBlock   // arena for the events' Blocks
	removed []kvroute.ExternalHash  // arena for the events' Removed
	extra   ExtraKeys
	mm      []uint64
	chunk   []uint32
	seen    []uint64 // hash set of repeats
	stats   ConvertStats
}

type hasherKey struct {
	lora, salt string
	eagle      bool
}

type groupKey struct {
	rank  kvroute.DPRank
	group int64
}

type chainKey struct {
	rank kvroute.DPRank
	ext  kvroute.ExternalHash
}

// identity is what a device store said of one block: enough to store a
// copy of it on another tier from an event that names only its hash.
type identity struct {
	parent    kvroute.ExternalHash
	hasParent bool
	hash      kvroute.BlockHash
}

// chunkTail is what a re-chunked event left over after its last full block.
type chunkTail struct {
	parent    kvroute.ExternalHash // the last full block's External
	hasParent bool
	tokens    []uint32 // engine tokens not yet in a full block
	mm        []uint64 // their multimodal hashes
}

// Bounds of the Converter's maps; a map that reaches its bound is cleared
// (counted in ConvertStats.StateClears, but for the hashers, which only
// cache what can be made again).
const (
	maxHashers = 64
	maxSalts   = 1 << 20
	maxTails   = 1 << 16
	maxKinds   = 1 << 10
	maxIDs     = 1 << 20
)

// NewConverter returns a Converter for cfg. It returns an error wrapping
// ErrConfig when the block size is out of range.
func NewConverter(cfg ConverterConfig) (*Converter, error) {
	h, err := kvroute.NewHasher(kvroute.HasherConfig{BlockSize: cfg.BlockSize, Namespace: cfg.Namespace})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	kinds := cfg.ReuseKinds
	if kinds == nil {
		kinds = DefaultReuseKinds
	}
	reuse := make(map[string]bool, len(kinds))
	for _, k := range kinds {
		reuse[k] = true
	}
	c := &Converter{
		cfg: cfg, log: log, base: h, reuse: reuse,
		hashers: make(map[hasherKey]kvroute.Hasher),
		kinds:   make(map[groupKey]string),
		salts:   make(map[chainKey]string),
		tails:   make(map[chainKey]*chunkTail),
	}
	if cfg.ExpectTierCopies {
		c.ids = make(map[chainKey]identity)
	}
	return c, nil
}

// Stats returns what the Converter has left out so far.
func (c *Converter) Stats() ConvertStats { return c.stats }

// BlockSize returns the block size events are indexed in.
func (c *Converter) BlockSize() int { return c.base.BlockSize() }

// hasher returns the hasher for an event's LoRA, salt and Eagle mode.
func (c *Converter) hasher(lora, salt string, eagle bool) kvroute.Hasher {
	if lora == "" && salt == "" && !eagle {
		return c.base
	}
	k := hasherKey{lora, salt, eagle}
	if h, ok := c.hashers[k]; ok {
		return h
	}
	h := c.base.WithLoRA(lora).WithSalt(salt).WithEagle(eagle)
	if len(c.hashers) >= maxHashers {
		clear(c.hashers)
	}
	c.hashers[k] = h
	return h
}

// Convert appends the kvroute.Events of batch b to dst and returns the
// extended slice. The events' Blocks and Removed slices point into the
// Converter and are valid until its next Convert call.
//
// It returns an error wrapping ErrInvalidEvent (and dst unchanged) when the
// batch's rank is out of range; events that cannot be converted are
// skipped and counted in Stats.
func (c *Converter) Convert(dst []kvroute.Event, b *Batch) ([]kvroute.Event, error) {
	rank := c.cfg.Rank
	if b.DPRank.Valid {
		if b.DPRank.Value < 0 || b.DPRank.Value > math.MaxUint32 {
			return dst, fmt.Errorf("%w: data-parallel rank %d", ErrInvalidEvent, b.DPRank.Value)
		}
		rank = kvroute.DPRank(b.DPRank.Value)
	}
	worker := kvroute.WorkerKey{ID: c.cfg.Worker, Rank: rank}
	if b.Skipped+b.Invalid != 0 {
		c.countDecodeSkips(b, worker)
	}
	// Size the arenas up front so that sub-slices stay valid.
	var nb, nr int
	for i := range b.Events {
		switch b.Events[i].Type {
		case BlockStored:
			nb += len(b.Events[i].BlockHashes)
		case BlockRemoved:
			nr += len(b.Events[i].BlockHashes)
		}
	}
	if cap(c.blocks) < nb {
		c.blocks = make([]kvroute.StoredBlock, 0, nb)
	}
	if cap(c.removed) < nr {
		c.removed = make([]kvroute.ExternalHash, 0, nr)
	}
	c.blocks, c.removed = c.blocks[:0], c.removed[:0]
	for i := range b.Events {
		ev := &b.Events[i]
		out := kvroute.Event{Worker: worker, Tier: TierOfMedium(ev.Medium)}
		if ev.Locality != "" && ev.Locality != "LOCAL" || ev.Ownership != "" {
			c.stats.NotLocal++
			c.skip(ev, "blocks not held by the engine itself")
			continue
		}
		switch ev.Type {
		case BlockStored:
			if !c.reusable(ev, rank, true) {
				continue
			}
			if c.repeats(ev) {
				c.stats.InvalidEvents++
				c.skip(ev, "block hashes repeat one another or the parent")
				continue
			}
			if len(ev.TokenIDs) == 0 && len(ev.BlockHashes) != 0 && out.Tier != kvroute.TierDevice {
				dst = c.tierCopy(dst, ev, rank, out)
				continue
			}
			if !c.stored(ev, rank, &out) {
				continue
			}
		case BlockRemoved:
			if !c.reusable(ev, rank, false) {
				continue
			}
			first, end := len(c.removed), len(c.removed)+len(ev.BlockHashes)
			rm := c.removed[first:end] // sized above
			for j := range rm {
				rm[j] = ev.BlockHashes[j].External()
			}
			c.removed = c.removed[:end]
			// Chain state follows the device copy: a block evicted from a
			// lower tier may still be extended on the device.
			if out.Tier == kvroute.TierDevice && len(c.salts)+len(c.tails)+len(c.ids) != 0 {
				for _, x := range rm {
					delete(c.salts, chainKey{rank, x})
					delete(c.ids, chainKey{rank, x})
					if t, ok := c.tails[chainKey{rank, x}]; ok {
						c.freeTail(chainKey{rank, x}, t)
					}
				}
			}
			out.Kind = kvroute.EventRemoved
			out.Removed = rm[:len(rm):len(rm)]
		case AllBlocksCleared:
			out.Kind = kvroute.EventCleared
			out.Tier = kvroute.TierDevice
			c.forget(rank)
		default:
			continue
		}
		dst = append(dst, out)
	}
	return dst, nil
}

// repeats reports whether the block hashes of a stored event repeat one
// another or its parent: a block would be its own ancestor, which no
// engine stores (Dynamo drops such events too); indexing it would move
// the worker's blocks of that hash into a chain that cannot exist. The
// hashes go into an open-addressing table of at least twice their number
// (0 marks an empty slot; the hash 0 is tracked apart), reused across
// events, so the check costs a few nanoseconds a block and allocates only
// to grow.
func (c *Converter) repeats(ev *EngineEvent) bool {
	hs := ev.BlockHashes
	if len(hs) <= 1 {
		return len(hs) == 1 && ev.ParentBlockHash.Valid() && hs[0].Key == ev.ParentBlockHash.Key
	}
	shift := 64 - bits.Len(uint(2*len(hs)+1))
	size := 1 << (64 - shift)
	if len(c.seen) < size {
		c.seen = make([]uint64, size)
	}
	tab, mask := c.seen[:size], size-1
	clear(tab)
	zero := false
	repeat := false
	for i := -1; i < len(hs) && !repeat; i++ {
		var k uint64
		if i < 0 {
			if !ev.ParentBlockHash.Valid() {
				continue
			}
			k = ev.ParentBlockHash.Key
		} else {
			k = hs[i].Key
		}
		if k == 0 {
			repeat, zero = zero, true
			continue
		}
		for j := int(k*0x9e3779b97f4a7c15>>shift) & mask; ; j = (j + 1) & mask {
			if tab[j] == 0 {
				tab[j] = k
				break
			}
			if tab[j] == k {
				repeat = true
				break
			}
		}
	}
	return repeat
}

// forget drops the chain state of a rank whose cache was cleared.
func (c *Converter) forget(rank kvroute.DPRank) {
	for k := range c.salts {
		if k.rank == rank {
			delete(c.salts, k)
		}
	}
	for k, t := range c.tails {
		if k.rank == rank {
			c.freeTail(k, t)
		}
	}
	for k := range c.ids {
		if k.rank == rank {
			delete(c.ids, k)
		}
	}
}

// tierCopy appends to dst the stored events of ev, a store on another tier
// of block hashes without tokens: one per chain of its blocks that earlier
// device stores described, in order.
func (c *Converter) tierCopy(dst []kvroute.Event, ev *EngineEvent, rank kvroute.DPRank, out kvroute.Event) []kvroute.Event {
	if c.ids == nil {
		// The first copy: remember device blocks from now on.
		c.ids = make(map[chainKey]identity)
	}
	c.stats.TierCopies++
	out.Kind = kvroute.EventStored
	n0 := len(dst)
	first := len(c.blocks)
	flush := func() {
		if len(c.blocks) > first {
			out.Blocks = c.blocks[first:len(c.blocks):len(c.blocks)]
			dst = append(dst, out)
			first = len(c.blocks)
		}
	}
	for _, h := range ev.BlockHashes {
		ext := h.External()
		id, ok := c.ids[chainKey{rank, ext}]
		if !ok {
			c.stats.DroppedBlocks++
			flush()
			continue
		}
		if len(c.blocks) == first || !id.hasParent || id.parent != c.blocks[len(c.blocks)-1].External {
			flush()
			out.HasParent, out.Parent = id.hasParent, id.parent
		}
		c.blocks = append(c.blocks, kvroute.StoredBlock{External: ext, Hash: id.hash}) // Convert sized it
	}
	flush()
	if len(dst) == n0 {
		c.skip(ev, "blocks of another tier that no device store described")
	}
	return dst
}

// remember records the identities of the device blocks an event stored,
// once tier copies are expected.
func (c *Converter) remember(rank kvroute.DPRank, out *kvroute.Event) {
	if len(c.ids)+len(out.Blocks) > maxIDs {
		clear(c.ids)
		c.stats.StateClears++
	}
	id := identity{parent: out.Parent, hasParent: out.HasParent}
	for _, b := range out.Blocks {
		id.hash = b.Hash
		c.ids[chainKey{rank, b.External}] = id
		id.parent, id.hasParent = b.External, true
	}
}

// reusable reports whether an event's KV-cache group decides prefix reuse,
// learning the kinds that stored events carry.
func (c *Converter) reusable(ev *EngineEvent, rank kvroute.DPRank, store bool) bool {
	kind := ev.SpecKind
	if kind != "" && ev.GroupIdx.Valid && store {
		k := groupKey{rank, ev.GroupIdx.Value}
		if old, ok := c.kinds[k]; !ok || old != kind {
			if !ok && len(c.kinds) >= maxKinds {
				// Past the bound (a producer naming ever new groups or
				// ranks) start afresh, as the other bounded maps do:
				// stopping would leave every later pair unknown for good,
				// and its removals skipped. The cleared pairs are learned
				// again from their next stores.
				clear(c.kinds)
				c.stats.StateClears++
			}
			c.kinds[k] = kind
		}
	}
	if kind == "" && ev.GroupIdx.Valid {
		var ok bool
		if kind, ok = c.kinds[groupKey{rank, ev.GroupIdx.Value}]; !ok {
			kind, ok = c.cfg.GroupKinds[ev.GroupIdx.Value]
		}
		if !ok {
			if ev.GroupIdx.Value == 0 {
				return true
			}
			c.skipGroup(ev, "KV-cache group of unknown kind")
			return false
		}
	}
	if kind == "" || c.reuse[kind] {
		return true
	}
	c.skipGroup(ev, "KV-cache group that does not decide prefix reuse")
	return false
}

func (c *Converter) skipGroup(ev *EngineEvent, why string) {
	c.stats.SkippedGroupEvents++
	c.stats.SkippedGroupBlocks += uint64(len(ev.BlockHashes))
	c.skip(ev, why)
}

// stored converts a BlockStored event into out. It reports false when the
// event is skipped.
func (c *Converter) stored(ev *EngineEvent, rank kvroute.DPRank, out *kvroute.Event) bool {
	lora := ev.LoRAName
	if lora == "" && ev.LoRAID.Valid {
		name, ok := c.cfg.LoRAs[ev.LoRAID.Value]
		if !ok {
			c.stats.UnknownLoRA++
			c.skip(ev, "lora_id without a name")
			return false
		}
		lora = name
	}
	if err := ParseExtraKeys(ev.ExtraKeys, lora, !ev.ParentBlockHash.Valid(), &c.extra); err != nil {
		c.stats.InvalidEvents++
		c.skip(ev, err.Error())
		return false
	}
	if ev.BlockMMInfos != nil {
		// Explicit per-block objects take the place of those extra_keys
		// names, as in Dynamo.
		if err := ParseBlockMMInfos(ev.BlockMMInfos, &c.extra); err != nil {
			c.stats.InvalidEvents++
			c.skip(ev, err.Error())
			return false
		}
	}
	salt := ev.CacheSalt
	if salt == "" {
		salt = c.extra.Salt
	}
	if salt == "" && ev.ParentBlockHash.Valid() && len(c.salts) != 0 {
		salt = c.salts[chainKey{rank, ev.ParentBlockHash.External()}]
	}
	bs := c.base.BlockSize()
	ebs := ev.BlockSize
	if ebs == 0 {
		ebs = bs
	}
	if ebs < 0 || ebs > kvroute.MaxBlockSize {
		c.stats.InvalidEvents++
		c.skip(ev, "block size out of range")
		return false
	}
	h := c.hasher(lora, salt, ev.Eagle)
	first := len(c.blocks)
	if ebs == bs {
		c.whole(ev, h)
	} else {
		if c.cfg.RejectBlockSize || ebs > bs || bs%ebs != 0 {
			c.stats.BlockSizeRejects++
			c.skip(ev, "block size differs from the router's")
			return false
		}
		if !c.rechunk(ev, rank, h, ebs, out) {
			c.stats.BlockSizeRejects++
			c.skip(ev, "continues a chain stored in another block size")
			return false
		}
		c.stats.Rechunked++
	}
	if len(c.blocks) == first {
		c.skip(ev, "no full block of tokens")
		return false
	}
	out.Kind = kvroute.EventStored
	out.Blocks = c.blocks[first:len(c.blocks):len(c.blocks)]
	if ebs == bs {
		out.HasParent = ev.ParentBlockHash.Valid()
		out.Parent = ev.ParentBlockHash.External()
	}
	out.LoRA = lora
	if c.ids != nil && ebs == bs && out.Tier == kvroute.TierDevice {
		c.remember(rank, out)
	}
	if salt != "" {
		c.stats.Salted++
		// Past the bound (salted blocks whose removals never came, after
		// a gap) start afresh: stopping would leave every later chain's
		// children without their salt for good.
		if len(c.salts)+len(ev.BlockHashes) > maxSalts {
			clear(c.salts)
			c.stats.StateClears++
		}
		for _, hh := range ev.BlockHashes {
			c.salts[chainKey{rank, hh.External()}] = salt
		}
	}
	return true
}

// whole converts the blocks of an event in the router's block size.
func (c *Converter) whole(ev *EngineEvent, h kvroute.Hasher) {
	bs, win := h.BlockSize(), h.WindowTokens()
	n := min(len(ev.BlockHashes), h.Blocks(len(ev.TokenIDs)))
	c.stats.DroppedBlocks += uint64(len(ev.BlockHashes) - n)
	if len(c.extra.MM) == 0 {
		first := len(c.blocks)
		c.blocks = slices.Grow(c.blocks, n)[:first+n] // Convert sized it
		bl, hs, ts := c.blocks[first:], ev.BlockHashes[:n], ev.TokenIDs
		for j := range bl {
			// Field by field: storing the whole struct writes its Tokens
			// pointer (with the write barrier's check), which is nil
			// unless a caller set it in an earlier event's Blocks.
			bl[j].External = hs[j].External()
			bl[j].Hash = h.HashBlock(ts[j*bs : j*bs+win])
			if bl[j].Tokens != nil {
				bl[j].Tokens = nil
			}
		}
		return
	}
	for j := range n {
		var mm []uint64
		if j < len(c.extra.MM) {
			mm = c.extra.MM[j]
		}
		if len(mm) != 0 {
			c.stats.MMBlocks++
		}
		c.blocks = append(c.blocks, kvroute.StoredBlock{
			External: ev.BlockHashes[j].External(),
			Hash:     h.HashBlockMM(ev.TokenIDs[j*bs:j*bs+win], mm),
		})
	}
}

// rechunk converts the blocks of an event whose engine block size ebs
// divides the router's, continuing what an earlier event of the chain left
// over. It sets out's parent. It reports false, converting nothing, when
// the tokens left over by the parent's event are not whole blocks of ebs
// (a chain whose block size changed).
func (c *Converter) rechunk(ev *EngineEvent, rank kvroute.DPRank, h kvroute.Hasher, ebs int, out *kvroute.Event) bool {
	bs, per := h.BlockSize(), h.BlockSize()/ebs
	eagle := 0
	if ev.Eagle {
		eagle = 1
	}
	// The engine blocks with all their tokens (and the Eagle lookahead).
	n := min(len(ev.BlockHashes), max(len(ev.TokenIDs)-eagle, 0)/ebs)
	c.chunk, c.mm = c.chunk[:0], c.mm[:0]
	var pend int // engine blocks carried over from the parent's event
	out.HasParent, out.Parent = ev.ParentBlockHash.Valid(), ev.ParentBlockHash.External()
	if out.HasParent {
		if t, ok := c.tails[chainKey{rank, out.Parent}]; ok {
			if len(t.tokens)%ebs != 0 {
				out.HasParent, out.Parent = false, 0
				return false
			}
			c.chunk = append(c.chunk, t.tokens...)
			c.mm = append(c.mm, t.mm...)
			out.HasParent, out.Parent = t.hasParent, t.parent
			pend = len(t.tokens) / ebs
		}
	}
	c.stats.DroppedBlocks += uint64(len(ev.BlockHashes) - n)
	c.chunk = append(c.chunk, ev.TokenIDs[:n*ebs+min(eagle, len(ev.TokenIDs))]...)
	total := pend + n
	full := total / per
	firstMM := len(c.mm) // c.mm holds the carried items, then a block's own
	for j := range full {
		// Engine blocks j*per .. (j+1)*per-1 of the combined chain.
		mm := c.mm[:firstMM]
		if j > 0 {
			mm = mm[:0:0]
		}
		mm = c.blockMM(mm, j*per-pend, (j+1)*per-pend)
		if len(mm) != 0 {
			c.stats.MMBlocks++
		}
		last := (j+1)*per - 1 - pend
		c.blocks = append(c.blocks, kvroute.StoredBlock{
			External: ev.BlockHashes[last].External(),
			Hash:     h.HashBlockMM(c.chunk[j*bs:j*bs+h.WindowTokens()], mm),
		})
	}
	if n == 0 {
		return true
	}
	// Keep what is left for the event that continues from the last block.
	key := chainKey{rank, ev.BlockHashes[n-1].External()}
	t := c.tails[key]
	if t == nil {
		if len(c.tails) >= maxTails {
			for k, x := range c.tails {
				c.freeTail(k, x)
			}
			c.stats.StateClears++
		}
		t = c.newTail()
		c.tails[key] = t
	}
	t.hasParent, t.parent = out.HasParent, out.Parent
	if full > 0 {
		t.hasParent, t.parent = true, c.blocks[len(c.blocks)-1].External
	}
	t.tokens = append(t.tokens[:0], c.chunk[full*bs:total*ebs]...)
	if full == 0 {
		t.mm = c.blockMM(append(t.mm[:0], c.mm[:firstMM]...), -pend, n)
	} else {
		t.mm = c.blockMM(t.mm[:0], full*per-pend, n)
	}
	return true
}

// maxFreeTails bounds the chunk tails kept for reuse.
const maxFreeTails = 1024

func (c *Converter) newTail() *chunkTail {
	if n := len(c.free); n > 0 {
		t := c.free[n-1]
		c.free = c.free[:n-1]
		return t
	}
	return new(chunkTail)
}

// freeTail forgets the tail at k, keeping x for reuse.
func (c *Converter) freeTail(k chainKey, x *chunkTail) {
	delete(c.tails, k)
	if len(c.free) < maxFreeTails {
		c.free = append(c.free, x)
	}
}

// blockMM appends to dst the multimodal hashes of the event's engine blocks
// [from, to) (negative indexes are carried blocks, already in dst),
// without duplicates.
func (c *Converter) blockMM(dst []uint64, from, to int) []uint64 {
	for j := max(from, 0); j < to && j < len(c.extra.MM); j++ {
		for _, x := range c.extra.MM[j] {
			if !slices.Contains(dst, x) {
				dst = append(dst, x)
			}
		}
	}
	return dst
}

// countDecodeSkips counts the events DecodeBatch skipped in b: of unknown
// types, or invalid (logged at Warn, sparingly).
func (c *Converter) countDecodeSkips(b *Batch, worker kvroute.WorkerKey) {
	c.stats.SkippedEvents += uint64(b.Skipped + b.Invalid)
	c.stats.UnknownTypes += uint64(b.Skipped)
	before := c.stats.InvalidEvents
	c.stats.InvalidEvents += uint64(b.Invalid)
	// Logged when invalid events first come and then each time their total
	// doubles: a producer whose every batch has one (a field whose type a
	// new engine version changed) must not flood the log.
	if b.Invalid != 0 && bits.Len64(before) != bits.Len64(c.stats.InvalidEvents) {
		c.log.Warn("kvevents: skipped invalid events", "worker", worker.String(),
			"count", b.Invalid, "total", c.stats.InvalidEvents, "first", b.InvalidErr)
	}
}

func (c *Converter) skip(ev *EngineEvent, why string) {
	c.stats.SkippedEvents++
	if !c.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	c.log.Debug("kvevents: skipped event", "type", ev.Type.String(), "reason", why,
		"worker", c.cfg.Worker, "blocks", len(ev.BlockHashes))
}
