package kvroute

import (
	"errors"
	"fmt"
)

// EventKind says what a KV-cache event reports.
type EventKind uint8

// The kinds of KV-cache events.
const (
	// EventStored reports blocks newly held by a worker, each a child of the
	// one before it and the first a child of Event.Parent.
	EventStored EventKind = iota + 1
	// EventRemoved reports blocks a worker no longer holds in Event.Tier.
	EventRemoved
	// EventCleared reports that a worker dropped its whole cache.
	EventCleared
)

// String returns the kind's name.
func (k EventKind) String() string {
	switch k {
	case EventStored:
		return "stored"
	case EventRemoved:
		return "removed"
	case EventCleared:
		return "cleared"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// StoredBlock is one block of an EventStored event.
type StoredBlock struct {
	// External is the engine's opaque hash of the block. Later events refer
	// to the block by it (as a parent or a removed block).
	External ExternalHash
	// Hash is the block's content hash as a Hasher computes it. It is used
	// when Tokens is empty.
	Hash BlockHash
	// Tokens are the block's token ids, when the event carries them. When
	// non-empty, the consumer computes Hash from them with its own Hasher
	// (and the event's LoRA name), ignoring the Hash field. They must be
	// the block's whole window, Hasher.WindowTokens of them: other lengths
	// hash to blocks no prompt matches. Only the LoRA name enters that
	// hash, so a block stored under a cache salt or holding multimodal
	// items carries Hash instead (Hasher.WithSalt, Hasher.HashBlockMM).
	Tokens []uint32
}

// Event is a KV-cache event in canonical form: what every decoder in
// package kvevents produces and what the indexer consumes.
//
// Events of one worker are ordered by ID. The slices are owned by whoever
// built the event; consumers do not retain them past the call they were
// given to.
type Event struct {
	// Kind says what the event reports.
	Kind EventKind
	// Worker is the cache domain the event comes from.
	Worker WorkerKey
	// ID is the event's per-worker sequence number: each event of a worker
	// has the ID of the one before plus one. Zero means unsequenced (replays
	// from a dump, or sources without numbering): such events are applied
	// without sequence checks.
	ID uint64
	// Tier is the storage tier the event is about. Cleared events clear
	// every tier regardless.
	Tier Tier
	// HasParent reports whether Parent is set. A Stored event without a
	// parent starts at the root of the prefix tree.
	HasParent bool
	// Parent is the engine's hash of the block that precedes Blocks[0].
	Parent ExternalHash
	// Blocks are the stored blocks, in prefix order (Stored only).
	Blocks []StoredBlock
	// Removed are the engine's hashes of removed blocks (Removed only).
	Removed []ExternalHash
	// LoRA is the LoRA adapter the stored blocks belong to, empty for the
	// base model. It selects the hashing seed when blocks carry Tokens.
	LoRA string
	// SeqHashes reports that the Hash of each of Blocks is the block's
	// sequence hash (a SeqHash, chained from its parent's) rather than its
	// content hash: the form in which an index that keeps no content
	// hashes dumps its blocks (see indexer.Index.Dump). The consumer takes
	// the hashes as they are; Tokens must be empty and LoRA is ignored.
	// Stored only.
	SeqHashes bool
}

// ErrInvalidEvent is wrapped by Event.Validate errors.
var ErrInvalidEvent = errors.New("kvroute: invalid event")

// Validate reports whether e is well formed: a known kind and tier, and
// blocks only where its kind has them, and sequence hashes only in Stored
// events without tokens. It does not check sequence numbers.
func (e *Event) Validate() error {
	if !e.Tier.Valid() {
		return fmt.Errorf("%w: tier %d", ErrInvalidEvent, e.Tier)
	}
	switch e.Kind {
	case EventStored:
		if len(e.Removed) != 0 {
			return fmt.Errorf("%w: stored event with removed hashes", ErrInvalidEvent)
		}
		if e.SeqHashes {
			for i := range e.Blocks {
				if len(e.Blocks[i].Tokens) != 0 {
					return fmt.Errorf("%w: stored event of sequence hashes with tokens", ErrInvalidEvent)
				}
			}
		}
	case EventRemoved:
		if e.SeqHashes {
			return fmt.Errorf("%w: removed event marked as of sequence hashes", ErrInvalidEvent)
		}
		if len(e.Blocks) != 0 || e.HasParent {
			return fmt.Errorf("%w: removed event with stored blocks or parent", ErrInvalidEvent)
		}
	case EventCleared:
		if len(e.Blocks) != 0 || len(e.Removed) != 0 || e.HasParent || e.SeqHashes {
			return fmt.Errorf("%w: cleared event with blocks", ErrInvalidEvent)
		}
	default:
		return fmt.Errorf("%w: kind %d", ErrInvalidEvent, e.Kind)
	}
	return nil
}

// String summarises the event for logs.
func (e *Event) String() string {
	switch e.Kind {
	case EventStored:
		return fmt.Sprintf("stored{worker=%s id=%d tier=%s blocks=%d}", e.Worker, e.ID, e.Tier, len(e.Blocks))
	case EventRemoved:
		return fmt.Sprintf("removed{worker=%s id=%d tier=%s blocks=%d}", e.Worker, e.ID, e.Tier, len(e.Removed))
	}
	return fmt.Sprintf("%s{worker=%s id=%d}", e.Kind, e.Worker, e.ID)
}
