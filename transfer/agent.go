package transfer

import (
	"context"
	"fmt"
)

// Agent is one endpoint of KV-block transfers, the Go mirror of NIXL's
// nixlAgent. Each backend package has a constructor that returns one.
//
// An agent owns registered memory, keeps the metadata of the remote agents
// it has loaded, and runs transfer requests between its memory and theirs.
// All methods are safe for concurrent use. Nothing blocks except where a
// context is taken; transfers complete asynchronously (see Request).
//
// After Close every method returns an error wrapping ErrClosed, and handles
// created by the agent return ErrClosed or ErrReleased.
type Agent interface {
	// Name returns the agent's name, unique among the agents that talk to
	// each other. Remote agents key notifications by it.
	Name() string

	// Plugins lists the backend plugins this agent can create.
	Plugins() ([]string, error)
	// CreateBackend instantiates a plugin with parameters. Constructors
	// create their configured backends already; call this for more.
	// It returns ErrNotSupported for an unknown plugin.
	CreateBackend(plugin string, params map[string]string) (Backend, error)
	// Backends returns the backends created so far, in creation order.
	Backends() []Backend

	// RegisterMem makes memory available for transfers, locally and (after
	// the metadata is exchanged) to remote agents. The memory must stay
	// valid until DeregisterMem or Close and must not be Go heap memory:
	// use a Buffer or memory from outside Go. Errors: ErrInvalidParam,
	// ErrNotSupported (memory kind).
	RegisterMem(l RegList) error
	// DeregisterMem removes a registration made with exactly these
	// descriptors. Errors: ErrNotRegistered.
	DeregisterMem(l RegList) error

	// LocalMetadata returns the bytes a remote agent loads to reach this one:
	// its name, its address and its registered memory. Fetch it again after
	// registering more memory.
	LocalMetadata() ([]byte, error)
	// LoadRemoteMetadata loads (or replaces) a remote agent's metadata and
	// returns its name. Errors: ErrBadMetadata.
	LoadRemoteMetadata(md []byte) (string, error)
	// InvalidateRemoteMetadata forgets a remote agent; transfers to it then
	// fail with ErrUnknownAgent. Errors: ErrUnknownAgent.
	InvalidateRemoteMetadata(remote string) error

	// PrepDescList prepares a descriptor list for requests by index: local
	// memory when remote is "", else memory of the named remote agent.
	// Errors: ErrUnknownAgent, ErrNotRegistered, ErrInvalidParam.
	PrepDescList(remote string, l DescList) (PreppedList, error)
	// MakeRequest builds a request from entries of two prepared lists:
	// localIdx[i] of local moves with remoteIdx[i] of remote, each pair of
	// equal length. Errors: ErrOutOfRange, ErrInvalidParam, ErrReleased.
	MakeRequest(op Op, local PreppedList, localIdx []int, remote PreppedList, remoteIdx []int, opts *RequestOptions) (Request, error)
	// CreateRequest builds a request from two descriptor lists of equal
	// length, local[i] moving with remote[i]. Errors: ErrUnknownAgent,
	// ErrNotRegistered, ErrInvalidParam.
	CreateRequest(op Op, local, remote DescList, remoteAgent string, opts *RequestOptions) (Request, error)

	// SendNotif sends a standalone notification to a remote agent.
	// Errors: ErrUnknownAgent, ErrRemoteDisconnect.
	SendNotif(remote string, msg []byte) error
	// Notifs returns and forgets the notifications received since the last
	// call, in arrival order per sender. It never blocks; see WaitNotif.
	Notifs() ([]Notif, error)

	// Close releases everything the agent holds and fails its running
	// requests. A second Close returns ErrClosed.
	Close() error
}

// Backend is a transfer backend instantiated inside an agent (NIXL's
// nixlBackendH), such as "TCP", "UCX" or "POSIX".
type Backend interface {
	// Plugin returns the plugin name the backend was created from.
	Plugin() string
	// MemKinds returns the memory kinds the backend can move.
	MemKinds() []MemKind
	// Params returns the backend's parameters after initialisation.
	Params() map[string]string
}

// PreppedList is a descriptor list prepared once and addressed by index by
// many requests (NIXL's nixlDlistH): how engines move layers × blocks.
type PreppedList interface {
	// Remote returns the remote agent's name, or "" for a local list.
	Remote() string
	// Len returns the number of descriptors.
	Len() int
	// Release frees the list. Requests made from it stay valid. A second
	// Release returns ErrReleased.
	Release() error
}

// Request is a transfer request (NIXL's nixlXferReqH). It is posted, then
// polled with Status or waited on with Wait, and can be posted again once
// it finished. Release it when done. Its methods are safe for concurrent
// use.
type Request interface {
	// Post starts the transfer and returns StatusInProgress (or StatusDone
	// when it finished inline). Posting a running request returns
	// ErrInProgress.
	Post() (Status, error)
	// Status polls the request without blocking. A failed transfer returns
	// StatusFailed and its error.
	Status() (Status, error)
	// Wait blocks until the posted transfer finishes or ctx ends, and
	// returns nil only when every byte landed.
	Wait(ctx context.Context) error
	// Release frees the request. A running request is canceled first:
	// afterwards no more data lands in local memory. A second Release
	// returns ErrReleased.
	Release() error
}

// CheckIndices validates the index lists of Agent.MakeRequest against
// prepared lists of nLocal and nRemote descriptors, for backends. Errors
// wrap ErrInvalidParam (lengths differ or are zero) or ErrOutOfRange.
func CheckIndices(localIdx, remoteIdx []int, nLocal, nRemote int) error {
	if len(localIdx) != len(remoteIdx) || len(localIdx) == 0 {
		return fmt.Errorf("%w: %d local and %d remote indices", ErrInvalidParam, len(localIdx), len(remoteIdx))
	}
	for i, l := range localIdx {
		r := remoteIdx[i]
		if l < 0 || l >= nLocal || r < 0 || r >= nRemote {
			return fmt.Errorf("%w: pair %d: index %d of %d local, %d of %d remote", ErrOutOfRange, i, l, nLocal, r, nRemote)
		}
	}
	return nil
}
