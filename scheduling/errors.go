package scheduling

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by this package wrap one of them, so
// callers test with errors.Is.
var (
	// ErrInvalidConfig is wrapped by constructors given an out-of-range
	// configuration. Fix the configuration; retrying does not help.
	ErrInvalidConfig = errors.New("scheduling: invalid config")
	// ErrNoCandidates is returned when there is no worker to choose from.
	ErrNoCandidates = errors.New("scheduling: no candidates")
	// ErrAllBusy is matched by *AllBusyError: every candidate is over a
	// busy threshold. The caller may queue the request or retry later.
	ErrAllBusy = errors.New("scheduling: all workers busy")
	// ErrDuplicateRequest is returned by Tracker.Add for an id that is
	// already tracked. The earlier request is left untouched.
	ErrDuplicateRequest = errors.New("scheduling: duplicate request id")
	// ErrInvalidRequest is returned for a request that cannot be tracked
	// (negative token counts).
	ErrInvalidRequest = errors.New("scheduling: invalid request")
	// ErrQueueFull is matched by *QueueFullError: the admission queue is at
	// capacity. The caller should shed the request (HTTP 429/503).
	ErrQueueFull = errors.New("scheduling: admission queue full")
	// ErrQueueClosed is returned by Queue.Wait after Queue.Close.
	ErrQueueClosed = errors.New("scheduling: admission queue closed")
)

// AllBusyError reports that every candidate was over a busy threshold. It
// matches ErrAllBusy with errors.Is.
type AllBusyError struct {
	// Candidates is the number of workers that were considered.
	Candidates int
}

// Error implements error.
func (e *AllBusyError) Error() string {
	return fmt.Sprintf("scheduling: all %d workers busy", e.Candidates)
}

// Is reports whether target is ErrAllBusy.
func (e *AllBusyError) Is(target error) bool { return target == ErrAllBusy }

// QueueFullError reports that the admission queue rejected a request
// because it already held Capacity waiting requests. It matches
// ErrQueueFull with errors.Is.
type QueueFullError struct {
	// Capacity is the queue's configured capacity.
	Capacity int
}

// Error implements error.
func (e *QueueFullError) Error() string {
	return fmt.Sprintf("scheduling: admission queue full (%d waiting)", e.Capacity)
}

// Is reports whether target is ErrQueueFull.
func (e *QueueFullError) Is(target error) bool { return target == ErrQueueFull }
