package openai

import (
	"bytes"
	"encoding/json"

	jsonv1 "github.com/go-json-experiment/json/v1"
)

// Usage is what kvroute reads of an OpenAI usage object.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens, valid
	// when CachedKnown (engines that do not report it leave it out).
	CachedTokens int
	CachedKnown  bool
}

// usageJSON is the wire form of Usage.
type usageJSON struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	PromptDetails    *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *usageJSON) usage() Usage {
	out := Usage{PromptTokens: max(u.PromptTokens, 0), CompletionTokens: max(u.CompletionTokens, 0)}
	if u.PromptDetails != nil && u.PromptDetails.CachedTokens != nil {
		out.CachedTokens, out.CachedKnown = max(*u.PromptDetails.CachedTokens, 0), true
	}
	return out
}

// chunkJSON is what kvroute reads of a response body or a streamed chunk.
type chunkJSON struct {
	Choices []json.RawMessage `json:"choices"`
	Usage   *usageJSON        `json:"usage"`
	Error   json.RawMessage   `json:"error"`
}

// decodeChunk decodes a response body or a chunk's data with
// encoding/json's rules (jsonv1, the same rules on encoding/json/v2's
// decoder, which decodes a chunk in 60% of the time): field names matched
// up to case, duplicates the last one winning, a field of the wrong type
// failing the whole chunk. A stream has a chunk per output token.
func decodeChunk(data []byte, c *chunkJSON) error { return jsonv1.Unmarshal(data, c) }

// ParseUsage reads the usage of a JSON response body (or of one streamed
// chunk's data), and reports whether the body has one.
func ParseUsage(body []byte) (Usage, bool) {
	var c chunkJSON
	if decodeChunk(body, &c) != nil || c.Usage == nil {
		return Usage{}, false
	}
	return c.Usage.usage(), true
}

// Event is one server-sent event of a response stream.
type Event struct {
	// Raw is the whole event as received, its blank line included.
	Raw []byte
	// Data is the event's data lines joined by newlines (empty for an
	// event without data, such as a comment).
	Data []byte
	// Done is set for the end marker "data: [DONE]".
	Done bool
	// Usage is the chunk's usage, when HasUsage.
	Usage    Usage
	HasUsage bool
	// UsageOnly is set for a chunk with usage and no choices: the one
	// an engine adds when stream_options.include_usage is set.
	UsageOnly bool
	// Error is set for a chunk carrying an "error" object.
	Error bool
	// HasChoices is set for a chunk with a non-empty "choices" array: one
	// step of the answer.
	HasChoices bool
}

// DefaultMaxEventBytes bounds one event in an EventScanner with a zero
// limit.
const DefaultMaxEventBytes = 4 << 20

// EventScanner splits a server-sent event stream that arrives in chunks of
// any size into events. Bytes of an event longer than its limit are passed
// on unread (Event.Data empty) as soon as the limit is reached, so a
// hostile stream cannot make it buffer without bound.
//
// An EventScanner is used by one goroutine; its zero value is ready, with
// DefaultMaxEventBytes.
type EventScanner struct {
	// MaxEventBytes bounds one event; zero means DefaultMaxEventBytes.
	MaxEventBytes int

	buf      []byte // bytes of the event being read
	skipping bool   // inside an oversized event: pass bytes through to its end
}

// Write feeds the next chunk of the stream and calls fn for every event
// completed by it, in order. The Event and its slices are valid only
// during the call.
func (s *EventScanner) Write(chunk []byte, fn func(*Event)) {
	limit := s.MaxEventBytes
	if limit <= 0 {
		limit = DefaultMaxEventBytes
	}
	// A terminator may straddle the previous chunk and this one.
	from := max(len(s.buf)-(maxBlankLine-1), 0)
	s.buf = append(s.buf, chunk...)
	start := 0
	for {
		end := blankLine(s.buf, max(from, start))
		if end < 0 {
			break
		}
		ev := Event{Raw: s.buf[start:end]}
		if !s.skipping {
			ev.Data = eventData(ev.Raw)
			inspect(&ev)
		}
		s.skipping = false
		fn(&ev)
		start = end
	}
	rest := s.buf[start:]
	if len(rest) > limit {
		// Pass the oversized event on but for its last bytes, which may
		// begin the blank line that ends it.
		keep := max(len(rest)-(maxBlankLine-1), 0)
		s.skipping = true
		fn(&Event{Raw: rest[:keep]})
		rest = rest[keep:]
	}
	s.buf = append(s.buf[:0], rest...)
}

// Flush returns what the scanner holds of an incomplete event (the end of
// a stream that did not finish with a blank line) and forgets it.
func (s *EventScanner) Flush() []byte {
	rest := s.buf
	s.buf, s.skipping = nil, false
	return rest
}

// maxBlankLine is the length of the longest blank line: a CRLF ending a
// line, then a CRLF ending an empty one.
const maxBlankLine = 4

// blankLine returns the offset just past the first blank line at or after
// from in b (a line end followed by another: see blankLineAt), or -1.
func blankLine(b []byte, from int) int {
	for i := from; i+1 < len(b); i++ {
		// Only a CR or an LF starts a terminator: jump to the next one
		// (LFs with IndexByte's vector search, then a CR before it).
		rest := b[i : len(b)-1]
		j := bytes.IndexByte(rest, '\n')
		if j < 0 {
			j = len(rest)
		}
		if k := bytes.IndexByte(rest[:j], '\r'); k >= 0 {
			j = k
		}
		if j == len(rest) {
			return -1
		}
		i += j
		if n := blankLineAt(b, i); n > 0 {
			return i + n
		}
	}
	return -1
}

// blankLineAt returns the length of a line end followed by an empty line
// starting at b[i], or 0. A line ends with a CRLF, an LF or a CR alone,
// as server-sent events allow, in any mix; a CR that ends b is not
// taken as a line end yet, since the LF of a CRLF may follow it.
func blankLineAt(b []byte, i int) int {
	n := lineEnd(b, i)
	if n <= 0 {
		return 0
	}
	m := lineEnd(b, i+n)
	if m <= 0 {
		return 0
	}
	return n + m
}

// lineEnd returns the length of the line end at b[i] (2 for a CRLF, 1
// for an LF or a CR followed by anything else), 0 when b[i] starts none,
// and -1 when b ends before it can tell (at i, or after a CR at i).
func lineEnd(b []byte, i int) int {
	switch {
	case i >= len(b):
		return -1
	case b[i] == '\n':
		return 1
	case b[i] != '\r':
		return 0
	case i+1 == len(b):
		return -1
	case b[i+1] == '\n':
		return 2
	}
	return 1
}

// eventData joins the data lines of one event.
func eventData(ev []byte) []byte {
	var data []byte
	has := false
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexAny(ev, "\r\n"); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if has {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(d, []byte(" "))...)
			has = true
		}
	}
	return data
}

// inspect fills an event's fields from its data.
func inspect(ev *Event) {
	if len(ev.Data) == 0 {
		return
	}
	if bytes.Equal(ev.Data, []byte("[DONE]")) {
		ev.Done = true
		return
	}
	var c chunkJSON
	if decodeChunk(ev.Data, &c) != nil {
		return
	}
	ev.Error = len(c.Error) > 0 && !isNull(c.Error)
	ev.HasChoices = len(c.Choices) > 0
	if c.Usage != nil {
		ev.Usage, ev.HasUsage = c.Usage.usage(), true
		ev.UsageOnly = len(c.Choices) == 0 && !ev.Error
	}
}
