package natsx

import (
	"context"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
)

// replyBuffer is the answers one request may have waiting: more are
// dropped, and the request times out and is tried again.
const replyBuffer = 1024

// replies multiplexes the answers to a replica's requests over one
// subscription, so that a request costs no subscription of its own (a
// nats.go subscription preallocates a large channel).
type replies struct {
	base string
	sub  *nats.Subscription
	mu   sync.Mutex // guards next and open
	next uint64
	open map[string]chan *nats.Msg
}

func openReplies(conn *nats.Conn) (*replies, error) {
	p := &replies{base: conn.NewRespInbox(), open: map[string]chan *nats.Msg{}}
	sub, err := conn.Subscribe(p.base+".*", p.deliver)
	if err != nil {
		return nil, err
	}
	p.sub = sub
	return p, nil
}

func (p *replies) deliver(m *nats.Msg) {
	p.mu.Lock()
	ch := p.open[m.Subject]
	p.mu.Unlock()
	if ch == nil {
		return // a late answer to an ended request
	}
	select {
	case ch <- m:
	default:
	}
}

// request returns a new reply subject, the channel its answers arrive on,
// and the function that ends the request.
func (p *replies) request() (string, <-chan *nats.Msg, func()) {
	ch := make(chan *nats.Msg, replyBuffer)
	p.mu.Lock()
	p.next++
	subject := p.base + "." + strconv.FormatUint(p.next, 36)
	p.open[subject] = ch
	p.mu.Unlock()
	return subject, ch, func() {
		p.mu.Lock()
		delete(p.open, subject)
		p.mu.Unlock()
	}
}

func (p *replies) close() { _ = p.sub.Unsubscribe() }

// nextReply returns the next answer on ch, or ctx's error.
func nextReply(ctx context.Context, ch <-chan *nats.Msg) (*nats.Msg, error) {
	select {
	case m := <-ch:
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
