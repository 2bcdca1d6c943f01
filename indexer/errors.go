package indexer

import (
	"errors"
	"fmt"

	"github.com/kvroute/kvroute"
)

// Errors returned by Index.Apply. Each says what happened to the event and
// what the caller should do.
var (
	// ErrDuplicate: the event's ID is not newer than the last event applied
	// for its worker. The event was not applied again; drop it.
	ErrDuplicate = errors.New("indexer: duplicate event")
	// ErrGap: the event's ID skips over events the index has not seen. The
	// event was not applied; the caller replays from GapError.Want, or
	// calls ResetWorker and continues from a fresh state.
	ErrGap = errors.New("indexer: gap in event sequence")
	// ErrUnknownParent: a Stored event names a parent block its worker does
	// not hold. The event was consumed (its ID counts as seen) but none of
	// its blocks was attached; the worker's view may be incomplete, so the
	// caller may request a replay or a resync of that worker.
	ErrUnknownParent = errors.New("indexer: unknown parent block")
	// ErrRepeatedBlock: a Stored event names one engine hash twice, as its
	// parent or one of its blocks and again for a later block: that block
	// would be its own ancestor, which no engine stores. The event was
	// consumed: its blocks before the repeated one were stored, the
	// repeated one and those after it were not, and the worker kept every
	// block it held before.
	ErrRepeatedBlock = errors.New("indexer: engine block hash repeated in a stored event")
)

// GapError reports a gap in a worker's event sequence. It matches ErrGap
// with errors.Is.
type GapError struct {
	Worker kvroute.WorkerKey
	Want   uint64 // the next ID the index expects
	Got    uint64 // the ID it was given
}

func (e *GapError) Error() string {
	return fmt.Sprintf("indexer: gap in event sequence of worker %s: want id %d, got %d", e.Worker, e.Want, e.Got)
}

// Is reports whether target is ErrGap.
func (e *GapError) Is(target error) bool { return target == ErrGap }

// UnknownParentError reports a Stored event whose parent block is unknown
// for its worker. It matches ErrUnknownParent with errors.Is.
type UnknownParentError struct {
	Worker  kvroute.WorkerKey
	Parent  kvroute.ExternalHash
	EventID uint64
}

func (e *UnknownParentError) Error() string {
	return fmt.Sprintf("indexer: stored event %d of worker %s names unknown parent block %#x", e.EventID, e.Worker, uint64(e.Parent))
}

// Is reports whether target is ErrUnknownParent.
func (e *UnknownParentError) Is(target error) bool { return target == ErrUnknownParent }

// RepeatedBlockError reports a Stored event cut short at a block whose
// engine hash the event named already. It matches ErrRepeatedBlock with
// errors.Is.
type RepeatedBlockError struct {
	Worker  kvroute.WorkerKey
	EventID uint64
	Block   kvroute.ExternalHash // the repeated engine hash
	Stored  int                  // the event's blocks stored, those before the repeated one
}

func (e *RepeatedBlockError) Error() string {
	return fmt.Sprintf("indexer: stored event %d of worker %s names engine block %#x again (a block its own ancestor): %d blocks stored, the rest refused", e.EventID, e.Worker, uint64(e.Block), e.Stored)
}

// Is reports whether target is ErrRepeatedBlock.
func (e *RepeatedBlockError) Is(target error) bool { return target == ErrRepeatedBlock }
