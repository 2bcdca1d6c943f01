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
