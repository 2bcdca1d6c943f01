package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// maxEventBytes bounds one server-sent event of an engine's stream.
const maxEventBytes = 4 << 20

var errEventTooLarge = errors.New("gateway: server-sent event too large")

// streamHooks receive what an sseBody learns from the stream.
type streamHooks interface {
	// chunk is called for every data event except the final [DONE].
	chunk(hasChoices bool, u *apiUsage, apiErr bool)
	// failed is called once when the upstream breaks mid-stream, with the
	// error; it returns the SSE event to send the client in its place, or
	// nil to pass the error on.
	failed(err error) []byte
}

// sseBody relays an engine's server-sent event stream one event per Read,
// so that the proxy flushes each to the client as it arrives. It reads
// each event's data: the usage of the last chunk (cached tokens), engine
// errors, and drops the usage-only chunk when dropUsage is set.
//
// An sseBody is used by one goroutine.
type sseBody struct {
	src       *bufio.Reader
	raw       io.Closer
	hooks     streamHooks
	dropUsage bool

	pending []byte // the event being returned
	event   []byte // the event being read
	data    []byte // its data lines, joined
	done    bool   // no more events
}

func newSSEBody(rc io.ReadCloser, hooks streamHooks, dropUsage bool) *sseBody {
	return &sseBody{src: bufio.NewReaderSize(rc, 16<<10), raw: rc, hooks: hooks, dropUsage: dropUsage}
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

// fill reads events until one is to be relayed and makes it pending. It
// returns io.EOF at the end of the stream, and an upstream error as is
// when hooks.failed returns nil for it.
func (b *sseBody) fill() error {
	for len(b.pending) == 0 {
		if b.done {
			return io.EOF
		}
		keep, err := b.next()
		switch {
		case err == io.EOF:
			b.done = true
		case err != nil:
			b.done = true
			if b.pending = b.hooks.failed(err); b.pending == nil {
				return err
			}
		case keep:
			b.pending = b.event
		}
	}
	return nil
}

// next reads one event into b.event and reports whether to relay it. It
// returns io.EOF at a clean end of the stream.
func (b *sseBody) next() (bool, error) {
	b.event, b.data = b.event[:0], b.data[:0]
	hasData := false
	for {
		line, err := b.src.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A long line: collect the rest of it.
			line, err = b.longLine(line)
		}
		if len(b.event)+len(line) > maxEventBytes {
			return false, errEventTooLarge
		}
		b.event = append(b.event, line...)
		if err != nil {
			if err == io.EOF && len(b.event) > 0 {
				return false, io.ErrUnexpectedEOF
			}
			return false, err
		}
		text := bytes.TrimRight(line, "\r\n")
		if len(text) == 0 {
			if !hasData {
				return true, nil // comments or fields without data
			}
			return b.inspect(), nil
		}
		if data, ok := bytes.CutPrefix(text, []byte("data:")); ok {
			if hasData {
				b.data = append(b.data, '\n')
			}
			b.data = append(b.data, bytes.TrimPrefix(data, []byte(" "))...)
			hasData = true
		}
	}
}

func (b *sseBody) longLine(start []byte) ([]byte, error) {
	line := append([]byte(nil), start...)
	for {
		more, err := b.src.ReadSlice('\n')
		if len(line)+len(more) > maxEventBytes {
			return line, errEventTooLarge
		}
		line = append(line, more...)
		if err != bufio.ErrBufferFull {
			return line, err
		}
	}
}

// streamChunk is the part of a streamed chunk the gateway reads.
type streamChunk struct {
	Choices []json.RawMessage `json:"choices"`
	Usage   *apiUsage         `json:"usage"`
	Error   json.RawMessage   `json:"error"`
}

// inspect reads the current event's data and reports whether to relay it.
func (b *sseBody) inspect() bool {
	if bytes.Equal(b.data, []byte("[DONE]")) {
		return true
	}
	var c streamChunk
	if err := json.Unmarshal(b.data, &c); err != nil {
		return true // not ours to judge: relay it
	}
	isErr := len(c.Error) > 0 && !bytes.Equal(c.Error, []byte("null"))
	b.hooks.chunk(len(c.Choices) > 0, c.Usage, isErr)
	return !(b.dropUsage && c.Usage != nil && len(c.Choices) == 0 && !isErr)
}

// errorEvent is the event that replaces the rest of a broken stream: an
// OpenAI error object, as vLLM sends one, then the end marker.
func errorEvent(status int, typ, msg string) []byte {
	return fmt.Appendf(nil, "data: %s\n\ndata: [DONE]\n\n", errorBody(status, typ, msg))
}
