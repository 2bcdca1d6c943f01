package kvevents

import (
	"errors"
	"fmt"
	"log/slog"
	"math"

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
)

// TierOfMedium maps an engine's medium to a storage tier:
//
//	"" (nil), "GPU"      → TierDevice
//	"CPU", "CPU_PINNED"  → TierHost (host DRAM, pinned or not)
//	"DISK"               → TierDisk
//	anything else        → TierExternal ("STORAGE", "EXTERNAL", unknown)
//
// Matching is exact (engines send upper case).
func TierOfMedium(medium string) kvroute.Tier {
	switch medium {
	case "", MediumGPU:
		return kvroute.TierDevice
	case MediumCPU, MediumCPUPinned:
		return kvroute.TierHost
	case MediumDisk:
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

// SaltedNamespace returns the hasher namespace for blocks stored under a
// cache salt (SGLang's cache_salt): the salt itself under an empty
// namespace, otherwise namespace, a NUL byte and the salt. A router that
// hashes a salted request must use the same namespace.
func SaltedNamespace(namespace, salt string) string {
	switch {
	case salt == "":
		return namespace
	case namespace == "":
		return salt
	}
	return namespace + "\x00" + salt
}

// ConverterConfig configures a Converter. The zero value converts events
// of worker 0 with block size 16 and no namespace.
type ConverterConfig struct {
	// Worker is the id of the engine the events come from. The cache
	// domain of each event is (Worker, the batch's data-parallel rank).
	Worker kvroute.WorkerID
	// BlockSize is used for events that carry no block_size. Zero means
	// kvroute.DefaultBlockSize.
	BlockSize int
	// Namespace is the hasher namespace (kvroute.HasherConfig.Namespace)
	// the router uses for this model. Empty means none.
	Namespace string
	// Logger receives debug records of skipped events. Nil discards.
	Logger *slog.Logger
}

// ConvertStats counts what conversion left out.
type ConvertStats struct {
	// SkippedEvents are events not converted: sliding-window groups and
	// stored events without a full block of tokens.
	SkippedEvents uint64
	// DroppedBlocks are stored block hashes without a full block of
	// token ids (including a partial last block).
	DroppedBlocks uint64
}

// Converter turns decoded engine batches into kvroute.Events, computing
// each stored block's kvroute.BlockHash from its token ids (the indexer's
// fast path: Hash set, Tokens nil) with the event's block size, LoRA name
// and cache salt.
//
// Conversion rules:
//   - the worker is (Config.Worker, batch rank); the event ID is 0 (the
//     transport numbers events);
//   - the tier is TierOfMedium(event.Medium);
//   - a stored event keeps the first min(len(block_hashes),
//     len(token_ids)/block_size) blocks: a partial last block is dropped;
//     an event left with no block is skipped;
//   - events of a sliding-window KV-cache group are skipped: their blocks
//     do not make reusable prefixes. Other groups of hybrid models are
//     converted;
//   - removed events keep every hash; AllBlocksCleared becomes
//     EventCleared.
//
// A Converter is not safe for concurrent use; use one per subscriber.
type Converter struct {
	cfg     ConverterConfig
	log     *slog.Logger
	base    kvroute.Hasher               // block size BlockSize, Namespace, no LoRA
	hashers map[hasherKey]kvroute.Hasher // LoRA and salt variants, bounded
	blocks  []kvroute.StoredBlock        // arena for the events' Blocks
	removed []kvroute.ExternalHash       // arena for the events' Removed
	stats   ConvertStats
}

type hasherKey struct {
	blockSize int
	lora      string
	salt      string
}

// maxHashers bounds the Converter's cache of hasher variants.
const maxHashers = 64

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
	return &Converter{cfg: cfg, log: log, base: h, hashers: make(map[hasherKey]kvroute.Hasher)}, nil
}

// Stats returns what the Converter has left out so far.
func (c *Converter) Stats() ConvertStats { return c.stats }

// hasher returns the hasher for an event's block size, LoRA and salt.
func (c *Converter) hasher(blockSize int, lora, salt string) (kvroute.Hasher, error) {
	if blockSize == 0 {
		blockSize = c.base.BlockSize()
	}
	if blockSize == c.base.BlockSize() && lora == "" && salt == "" {
		return c.base, nil
	}
	k := hasherKey{blockSize, lora, salt}
	if h, ok := c.hashers[k]; ok {
		return h, nil
	}
	h, err := kvroute.NewHasher(kvroute.HasherConfig{
		BlockSize: blockSize,
		LoRA:      lora,
		Namespace: SaltedNamespace(c.cfg.Namespace, salt),
	})
	if err != nil {
		return h, fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	if len(c.hashers) >= maxHashers {
		clear(c.hashers)
	}
	c.hashers[k] = h
	return h, nil
}

// Convert appends the kvroute.Events of batch b to dst and returns the
// extended slice. The events' Blocks and Removed slices point into the
// Converter and are valid until its next Convert call.
//
// It returns an error wrapping ErrInvalidEvent (and dst unchanged) when the
// batch's rank or an event's block size is out of range.
func (c *Converter) Convert(dst []kvroute.Event, b *Batch) ([]kvroute.Event, error) {
	rank := b.Rank()
	if rank < 0 || rank > math.MaxUint32 {
		return dst, fmt.Errorf("%w: data-parallel rank %d", ErrInvalidEvent, rank)
	}
	worker := kvroute.WorkerKey{ID: c.cfg.Worker, Rank: kvroute.DPRank(rank)}
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
	start := len(dst)
	for i := range b.Events {
		ev := &b.Events[i]
		out := kvroute.Event{Worker: worker, Tier: TierOfMedium(ev.Medium)}
		switch ev.Type {
		case BlockStored:
			if ev.SpecKind == "sliding_window" {
				c.skip(ev, "sliding-window group")
				continue
			}
			h, err := c.hasher(ev.BlockSize, ev.LoRAName, ev.CacheSalt)
			if err != nil {
				return dst[:start], fmt.Errorf("event %d: %w", i, err)
			}
			bs := h.BlockSize()
			n := min(len(ev.BlockHashes), len(ev.TokenIDs)/bs)
			c.stats.DroppedBlocks += uint64(len(ev.BlockHashes) - n)
			if n == 0 {
				c.skip(ev, "no full block of tokens")
				continue
			}
			first := len(c.blocks)
			for j := range n {
				c.blocks = append(c.blocks, kvroute.StoredBlock{
					External: ev.BlockHashes[j].External(),
					Hash:     h.HashBlock(ev.TokenIDs[j*bs : (j+1)*bs]),
				})
			}
			out.Kind = kvroute.EventStored
			out.Blocks = c.blocks[first:len(c.blocks):len(c.blocks)]
			out.HasParent = ev.ParentBlockHash.Valid()
			out.Parent = ev.ParentBlockHash.External()
			out.LoRA = ev.LoRAName
		case BlockRemoved:
			if ev.SpecKind == "sliding_window" {
				c.skip(ev, "sliding-window group")
				continue
			}
			first := len(c.removed)
			for _, hh := range ev.BlockHashes {
				c.removed = append(c.removed, hh.External())
			}
			out.Kind = kvroute.EventRemoved
			out.Removed = c.removed[first:len(c.removed):len(c.removed)]
		case AllBlocksCleared:
			out.Kind = kvroute.EventCleared
			out.Tier = kvroute.TierDevice
		default:
			continue
		}
		dst = append(dst, out)
	}
	return dst, nil
}

func (c *Converter) skip(ev *EngineEvent, why string) {
	c.stats.SkippedEvents++
	c.log.Debug("kvevents: skipped event", "type", ev.Type.String(), "reason", why,
		"worker", c.cfg.Worker, "blocks", len(ev.BlockHashes))
}
