package tcp

import (
	"context"
	"sync"

	"github.com/kvroute/kvroute/transfer"
)

// request is a transfer.Request of the TCP backend.
//
// Lock order: Agent.mu, then request.mu, then peerConn.mu. copyMu is taken
// before mu by the connection goroutines, which hold it while bytes move
// into or out of local memory, so that Release can wait for them.
type request struct {
	agent    *Agent
	op       transfer.Op
	remote   string
	local    []transfer.Desc
	rdescs   []transfer.Desc
	notif    []byte
	hasNotif bool

	copyMu sync.Mutex // held while the request's local memory is being copied

	mu sync.Mutex // protects the fields below
	// state is the request's status; err is set when it is StatusFailed.
	state transfer.Status
	err   error
	// id names the current posting on the wire; responses to older
	// postings are ignored.
	id uint64
	// done is closed when the current posting finishes.
	done     chan struct{}
	released bool
	conn     *peerConn
}

func (a *Agent) newRequest(opName string, op transfer.Op, local, rdescs []transfer.Desc, remoteName string, opts *transfer.RequestOptions) (*request, error) {
	if !op.Valid() {
		return nil, a.errorf(opName, remoteName, transfer.ErrInvalidParam, "operation %d", op)
	}
	for i := range local {
		if local[i].Len != rdescs[i].Len {
			return nil, a.errorf(opName, remoteName, transfer.ErrInvalidParam, "pair %d: %d local bytes, %d remote bytes", i, local[i].Len, rdescs[i].Len)
		}
	}
	if len(local) > maxFrameDescs {
		return nil, a.errorf(opName, remoteName, transfer.ErrInvalidParam, "%d descriptors (max %d per request)", len(local), maxFrameDescs)
	}
	r := &request{agent: a, op: op, remote: remoteName, local: local, rdescs: rdescs}
	if opts != nil && opts.Notif != nil {
		if len(opts.Notif) > maxNotifLen {
			return nil, a.errorf(opName, remoteName, transfer.ErrInvalidParam, "notification of %d bytes (max %d)", len(opts.Notif), maxNotifLen)
		}
		r.notif, r.hasNotif = append([]byte{}, opts.Notif...), true
	}
	return r, nil
}

// Post queues the request on the connection to its remote agent.
func (r *request) Post() (transfer.Status, error) {
	a := r.agent
	a.mu.Lock()
	defer a.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.released:
		return r.state, a.errorf("post", r.remote, transfer.ErrReleased, "")
	case a.closed:
		return r.state, a.errorf("post", r.remote, transfer.ErrClosed, "")
	case r.state == transfer.StatusInProgress:
		return r.state, a.errorf("post", r.remote, transfer.ErrInProgress, "")
	}
	c, err := a.connLocked("post", r.remote)
	if err != nil {
		return r.state, err
	}
	r.id = a.nextID.Add(1)
	r.state, r.err, r.done, r.conn = transfer.StatusInProgress, nil, make(chan struct{}), c
	kind := kindWrite
	if r.op == transfer.Read {
		kind = kindRead
	}
	if err := c.enqueue(&frame{kind: kind, id: r.id, req: r, notif: r.notif, hasNotif: r.hasNotif && r.op == transfer.Write}); err != nil {
		r.finish(err)
		return r.state, err
	}
	return transfer.StatusInProgress, nil
}

// active reports whether posting id is still running. The caller holds mu.
func (r *request) active(id uint64) bool {
	return !r.released && r.state == transfer.StatusInProgress && r.id == id
}

// complete finishes posting id with err (nil for success).
func (r *request) complete(id uint64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.active(id) {
		return
	}
	r.finish(err)
}

// finish ends the current posting. The caller holds mu.
func (r *request) finish(err error) {
	if err != nil {
		r.state, r.err = transfer.StatusFailed, err
	} else {
		r.state = transfer.StatusDone
	}
	close(r.done)
}

// Status polls the request.
func (r *request) Status() (transfer.Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return r.state, r.agent.errorf("status", r.remote, transfer.ErrReleased, "")
	}
	return r.state, r.err
}

// Wait blocks until the posted transfer finishes or ctx ends. The result
// of a finished transfer is returned even when ctx ended too.
func (r *request) Wait(ctx context.Context) error {
	r.mu.Lock()
	done, state := r.done, r.state
	released := r.released
	r.mu.Unlock()
	switch {
	case released:
		return r.agent.errorf("wait", r.remote, transfer.ErrReleased, "")
	case state == transfer.StatusIdle:
		return r.agent.errorf("wait", r.remote, transfer.ErrInvalidParam, "request not posted")
	}
	// A finished transfer reports its result even when ctx ended too.
	select {
	case <-done:
	default:
		select {
		case <-done:
		case <-ctx.Done():
			return r.agent.errorf("wait", r.remote, ctx.Err(), "")
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Release frees the request, canceling a running posting. It returns once
// no connection goroutine touches the request's local memory any more,
// also when it returns ErrClosed.
func (r *request) Release() error {
	r.agent.mu.Lock()
	closed := r.agent.closed
	r.agent.mu.Unlock()
	r.mu.Lock()
	if r.released {
		r.mu.Unlock()
		return r.agent.errorf("release", r.remote, transfer.ErrReleased, "")
	}
	var err error
	switch {
	case closed:
		// Close fails the posting; a copy may still run until Close
		// has shut the connection, and is waited for below.
		err = r.agent.errorf("release", r.remote, transfer.ErrClosed, "")
	case r.state == transfer.StatusInProgress:
		r.finish(r.agent.errorf("transfer", r.remote, transfer.ErrCanceled, ""))
		r.conn.forget(r.id)
	}
	r.released = true
	r.mu.Unlock()
	// Wait for a copy that started before the cancellation.
	r.copyMu.Lock()
	defer r.copyMu.Unlock()
	return err
}
