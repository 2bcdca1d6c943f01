package gateway

import (
	"bytes"
	"fmt"
	"io"

	"github.com/kvroute/kvroute/openai"
)

// maxEventBytes bounds one server-sent event of an engine's stream that
// the gateway reads; a longer event is relayed unread, as it arrives.
const maxEventBytes = 4 << 20

// streamHooks receive what an sseBody learns from the stream.
type streamHooks interface {
	// chunk is called for every event with data, [DONE] aside.
	chunk(ev *openai.Event)
	// failed is called once when the upstream breaks mid-stream, with the
	// error; it returns the SSE event to send the client in its place, or
	// nil to pass the error on.
	failed(err error) []byte
}

// sseBody relays an engine's server-sent event stream one event per Read,
// so that the proxy flushes each to the client as it arrives. It reads
// each event's data with openai.EventScanner: the usage of the last chunk
// (cached tokens), engine errors, and drops the usage-only chunk when
// dropUsage is set.
//
// An sseBody is used by one goroutine.
type sseBody struct {
	src       io.Reader
	raw       io.Closer
	hooks     streamHooks
	dropUsage bool

	scan    openai.EventScanner
	buf     []byte   // read buffer
	queue   [][]byte // complete events to relay, in order
	pending []byte   // the event being returned
	whole   bool     // the end marker ([DONE]) was read: the answer is whole
	done    bool     // the upstream ended
	err     error    // why it ended, io.EOF for a clean end
}

func newSSEBody(rc io.ReadCloser, hooks streamHooks, dropUsage bool) *sseBody {
	return &sseBody{src: rc, raw: rc, hooks: hooks, dropUsage: dropUsage,
		scan: openai.EventScanner{MaxEventBytes: maxEventBytes}, buf: make([]byte, 16<<10)}
}

// Read implements io.Reader.
func (b *sseBody) Read(p []byte) (int, error) {
	if len(b.pending) == 0 {
		if err := b.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	return n, nil
}

// Close implements io.Closer.
func (b *sseBody) Close() error { return b.raw.Close() }

// fill makes the next event to relay pending. It returns io.EOF at the
// end of the stream, and an upstream error as is when hooks.failed returns
// nil for it; the events completed before the upstream broke are relayed
// first. A break after the end marker is the end of the stream: the
// answer was whole (the client, having it, may have gone, which ends
// the upstream request).
func (b *sseBody) fill() error {
	for len(b.pending) == 0 {
		if len(b.queue) > 0 {
			b.pending, b.queue = b.queue[0], b.queue[1:]
			continue
		}
		if b.done {
			if b.err == io.EOF {
				return io.EOF
			}
			err := b.err
			b.err = io.EOF // the failure is reported once
			if b.pending = b.hooks.failed(err); b.pending == nil {
				return err
			}
			continue
		}
		n, err := b.src.Read(b.buf)
		if n > 0 {
			b.scan.Write(b.buf[:n], b.collect)
		}
		if err == nil {
			continue
		}
		if err == io.EOF && len(b.scan.Flush()) > 0 {
			err = io.ErrUnexpectedEOF // the last event is incomplete
		}
		if b.whole {
			err = io.EOF
		}
		b.done, b.err = true, err
	}
	return nil
}

// collect inspects one complete event and queues it unless it is the
// usage-only chunk to drop.
func (b *sseBody) collect(ev *openai.Event) {
	if len(ev.Data) > 0 && !ev.Done {
		b.hooks.chunk(ev)
	}
	b.whole = b.whole || ev.Done
	if b.dropUsage && ev.UsageOnly {
		return
	}
	b.queue = append(b.queue, bytes.Clone(ev.Raw))
}

// errorEvent is the event that replaces the rest of a broken stream: an
// OpenAI error object, as vLLM sends one, then the end marker.
func errorEvent(status int, typ, msg string) []byte {
	return fmt.Appendf(nil, "data: %s\n\ndata: [DONE]\n\n", errorBody(status, typ, msg))
}
