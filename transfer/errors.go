package transfer

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error a backend returns wraps one of them (usually
// inside an *Error), so callers test with errors.Is.
var (
	// ErrClosed: the agent was closed. Give up on it.
	ErrClosed = errors.New("transfer: agent closed")
	// ErrReleased: the handle (request or prepared list) was released.
	ErrReleased = errors.New("transfer: handle released")
	// ErrInvalidParam: an argument is malformed (empty list, mixed kinds,
	// zero-length descriptor, mismatched list lengths). Fix the call.
	ErrInvalidParam = errors.New("transfer: invalid parameter")
	// ErrNotRegistered: a descriptor does not lie inside memory its owner
	// registered (locally, or in the remote metadata).
	ErrNotRegistered = errors.New("transfer: memory not registered")
	// ErrUnknownAgent: no metadata is loaded for the named remote agent.
	// Load its metadata and retry.
	ErrUnknownAgent = errors.New("transfer: unknown remote agent")
	// ErrOutOfRange: an index into a prepared descriptor list is out of range.
	ErrOutOfRange = errors.New("transfer: descriptor index out of range")
	// ErrNotSupported: the backend cannot do this (memory kind, plugin).
	ErrNotSupported = errors.New("transfer: not supported")
	// ErrRemoteDisconnect: the peer went away before the transfer finished.
	// The transfer did not complete; retry after reloading its metadata.
	ErrRemoteDisconnect = errors.New("transfer: remote disconnected")
	// ErrInProgress: the request is still running (posting it again, for
	// example). Wait for it first.
	ErrInProgress = errors.New("transfer: request in progress")
	// ErrCanceled: the request was released while it was running.
	ErrCanceled = errors.New("transfer: request canceled")
	// ErrBadMetadata: metadata bytes could not be decoded.
	ErrBadMetadata = errors.New("transfer: bad metadata")
	// ErrMismatch: two layouts or lists cannot be mapped onto each other.
	ErrMismatch = errors.New("transfer: mismatch")
	// ErrBackend: the backend failed for a reason it does not classify.
	ErrBackend = errors.New("transfer: backend error")
	// ErrUnavailable: the backend's library cannot be loaded on this host.
	ErrUnavailable = errors.New("transfer: backend unavailable")
)

// Error is the error type backends return. It names the operation and the
// agents involved, and wraps a sentinel (and sometimes a cause).
type Error struct {
	// Op is the operation that failed, such as "post" or "register".
	Op string
	// Agent is the local agent's name.
	Agent string
	// Remote is the remote agent's name, when there is one.
	Remote string
	// Code is the backend's raw status code, zero when there is none.
	Code int
	// Err is the sentinel (or a wrapped sentinel) that classifies the error.
	Err error
}

// Error formats the error as "transfer: agent a: post to b: <cause>".
func (e *Error) Error() string {
	s := "transfer: agent " + e.Agent + ": " + e.Op
	if e.Remote != "" {
		s += " (remote " + e.Remote + ")"
	}
	if e.Code != 0 {
		s += fmt.Sprintf(" [code %d]", e.Code)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the classifying error.
func (e *Error) Unwrap() error { return e.Err }

// Errorf builds an *Error for op that wraps err (typically a sentinel)
// with a formatted detail. Backends use it so every error has one shape.
func Errorf(agent, op, remote string, err error, format string, args ...any) *Error {
	if format != "" {
		err = fmt.Errorf("%w: "+format, append([]any{err}, args...)...)
	}
	return &Error{Op: op, Agent: agent, Remote: remote, Err: err}
}
