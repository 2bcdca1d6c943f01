package transfer

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvroute/kvroute/transfer/internal/poll"
)

// Inbox collects an agent's notifications so that several waiters can each
// take the ones they expect: Agent.Notifs drains everything, which would
// lose other waiters' messages. All methods are safe for concurrent use.
type Inbox struct {
	agent Agent
	mu    sync.Mutex // protects pending
	// pending holds drained notifications no waiter has taken yet.
	pending []Notif
}

// NewInbox returns an Inbox over a.
func NewInbox(a Agent) *Inbox { return &Inbox{agent: a} }

// Take drains the agent and returns the first pending notification match
// accepts (nil accepts any), removing it. It never blocks.
func (in *Inbox) Take(match func(Notif) bool) (Notif, bool, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	got, err := in.agent.Notifs()
	in.pending = append(in.pending, got...)
	for i, n := range in.pending {
		if match == nil || match(n) {
			in.pending = append(in.pending[:i], in.pending[i+1:]...)
			return n, true, nil
		}
	}
	return Notif{}, false, err
}

// Wait polls until a notification match accepts arrives, and returns it.
// It returns ctx's error when ctx ends first, and the agent's error (such
// as ErrClosed) when it can no longer receive.
func (in *Inbox) Wait(ctx context.Context, match func(Notif) bool) (Notif, error) {
	var out Notif
	err := poll.Until(ctx, func() (bool, error) {
		n, ok, err := in.Take(match)
		if ok {
			out = n
			return true, nil
		}
		return false, err
	})
	if err != nil {
		return Notif{}, fmt.Errorf("transfer: wait for notification: %w", err)
	}
	return out, nil
}

// Len returns the number of notifications drained but not taken.
func (in *Inbox) Len() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.pending)
}

// From returns a match function accepting notifications from agent with
// message msg (any message when msg is nil).
func From(agent string, msg []byte) func(Notif) bool {
	return func(n Notif) bool {
		return n.From == agent && (msg == nil || string(n.Msg) == string(msg))
	}
}
