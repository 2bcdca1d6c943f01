package dynamo

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute/kvevents"
)

// ErrMalformed is wrapped by every decoding error: the bytes are not what
// Dynamo's event plane sends.
var ErrMalformed = errors.New("dynamo: malformed event-plane message")

// Wire constants of Dynamo's event plane.
const (
	// FrameVersion is the version byte that starts the ZMQ data frame.
	FrameVersion = 0x01
	// FrameHeaderSize is the data frame's header: the version byte and
	// the envelope's length as a 4-byte big-endian integer.
	FrameHeaderSize = 5
	// ZMQFrames is the number of frames of one ZMQ message: topic,
	// publisher id, sequence, data.
	ZMQFrames = 4
)

// Dynamo's topics on the event plane.
const (
	// TopicKVEvents carries lists of RouterEvents (KV-cache stores,
	// removals and clears) from each worker's KV event publisher.
	TopicKVEvents = "kv-events"
	// TopicKVMetrics carries a worker's ActiveLoad (kv_used_blocks,
	// active_decode_blocks, active_prefill_tokens) on every change.
	TopicKVMetrics = "kv_metrics"
	// TopicForwardPassMetrics carries a worker's ForwardPassMetrics after
	// every engine step, and once a second when idle.
	TopicForwardPassMetrics = "forward-pass-metrics"
	// TopicActiveSequences carries routers' active-sequence
	// synchronisation; a Subscriber counts and skips it.
	TopicActiveSequences = "active_sequences_events"
)

// Envelope is Dynamo's EventEnvelope: the metadata around every payload
// published on the event plane (named msgpack, rmp_serde::to_vec_named).
//
// A decoded Envelope's Payload aliases the decoded bytes.
type Envelope struct {
	// Topic is the topic the event was published to, such as "kv-events".
	Topic string
	// PublisherID identifies the publisher (a random id, registered in
	// discovery's v1/event_channels and v1/event_sources); sequence
	// numbers count per publisher.
	PublisherID uint64
	// Sequence is the publisher's message number, from 0, one more per
	// message.
	Sequence uint64
	// PublishedAt is the publish time in Unix milliseconds.
	PublishedAt uint64
	// Payload is the msgpack payload: a list of RouterEvents on
	// "kv-events", an ActiveLoad on "kv_metrics", ForwardPassMetrics on
	// "forward-pass-metrics".
	Payload []byte
}

// DecodeEnvelope decodes a msgpack EventEnvelope (the NATS message body,
// or a ZMQ data frame after its 5-byte header) into e. Unknown fields are
// skipped; publisher_id, sequence and payload are required. Errors wrap
// ErrMalformed.
func DecodeEnvelope(p []byte, e *Envelope) error {
	*e = Envelope{}
	var have uint8
	rest, err := readMap(p, "envelope", func(key, p []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "topic":
			var s []byte
			s, p, err = msgp.ReadStringZC(p)
			e.Topic = topicString(s)
		case "publisher_id":
			e.PublisherID, p, err = msgp.ReadUint64Bytes(p)
			have |= 1
		case "sequence":
			e.Sequence, p, err = msgp.ReadUint64Bytes(p)
			have |= 2
		case "published_at":
			e.PublishedAt, p, err = msgp.ReadUint64Bytes(p)
		case "payload":
			e.Payload, p, err = readBytesOrArray(p)
			have |= 4
		default:
			return msgp.Skip(p)
		}
		return p, err
	})
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: %d bytes after the envelope", ErrMalformed, len(rest))
	}
	if have != 7 {
		return fmt.Errorf("%w: envelope without publisher_id, sequence or payload", ErrMalformed)
	}
	return nil
}

// readBytesOrArray reads a msgpack bin (what rmp_serde writes for
// serialize_bytes) or, from other encoders, an array of small integers.
func readBytesOrArray(p []byte) ([]byte, []byte, error) {
	if msgp.NextType(p) == msgp.BinType {
		return msgp.ReadBytesZC(p)
	}
	n, o, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil {
		return nil, o, err
	}
	if int64(n) > int64(len(o)) {
		return nil, o, fmt.Errorf("array of %d bytes in %d bytes", n, len(o))
	}
	out := make([]byte, n)
	for i := range out {
		var b uint8
		if b, o, err = msgp.ReadUint8Bytes(o); err != nil {
			return nil, o, err
		}
		out[i] = b
	}
	return out, o, nil
}

// AppendEnvelope appends e encoded as Dynamo encodes an EventEnvelope
// (rmp_serde::to_vec_named, fields in Dynamo's order: publisher_id,
// sequence, published_at, topic, payload as bin).
func AppendEnvelope(dst []byte, e *Envelope) []byte {
	dst = msgp.AppendMapHeader(dst, 5)
	dst = msgp.AppendString(dst, "publisher_id")
	dst = msgp.AppendUint64(dst, e.PublisherID)
	dst = msgp.AppendString(dst, "sequence")
	dst = msgp.AppendUint64(dst, e.Sequence)
	dst = msgp.AppendString(dst, "published_at")
	dst = msgp.AppendUint64(dst, e.PublishedAt)
	dst = msgp.AppendString(dst, "topic")
	dst = msgp.AppendString(dst, e.Topic)
	dst = msgp.AppendString(dst, "payload")
	return msgp.AppendBytes(dst, e.Payload)
}

// Message is one event-plane message as received over ZMQ: the frames'
// topic, publisher id and sequence, and the decoded envelope. Its payload
// aliases the frames.
type Message struct {
	// Topic, PublisherID and Sequence are the first three ZMQ frames.
	Topic       string
	PublisherID uint64
	Sequence    uint64
	// Envelope is the fourth frame's envelope. DecodeZMQ checks that its
	// publisher id, sequence and topic agree with the frames.
	Envelope Envelope
}

// DecodeZMQ decodes the frames of one ZMQ event-plane message: [topic,
// publisher id (8 bytes, big-endian), sequence (8 bytes, big-endian),
// data], the data frame being FrameVersion, the envelope's length (4
// bytes, big-endian) and the msgpack envelope. m's payload aliases the
// frames. Errors wrap ErrMalformed.
func DecodeZMQ(frames [][]byte, m *Message) error {
	*m = Message{}
	if len(frames) != ZMQFrames {
		return fmt.Errorf("%w: %d frames, want %d", ErrMalformed, len(frames), ZMQFrames)
	}
	if len(frames[1]) != 8 || len(frames[2]) != 8 {
		return fmt.Errorf("%w: publisher id or sequence frame of %d and %d bytes", ErrMalformed, len(frames[1]), len(frames[2]))
	}
	m.Topic = topicString(frames[0])
	m.PublisherID = binary.BigEndian.Uint64(frames[1])
	m.Sequence = binary.BigEndian.Uint64(frames[2])
	body, err := DecodeFrame(frames[3])
	if err != nil {
		return err
	}
	if err := DecodeEnvelope(body, &m.Envelope); err != nil {
		return err
	}
	e := &m.Envelope
	if e.PublisherID != m.PublisherID || e.Sequence != m.Sequence {
		return fmt.Errorf("%w: frames say publisher %d sequence %d, envelope %d/%d",
			ErrMalformed, m.PublisherID, m.Sequence, e.PublisherID, e.Sequence)
	}
	if e.Topic != "" && e.Topic != m.Topic {
		return fmt.Errorf("%w: topic frame %q, envelope topic %q", ErrMalformed, m.Topic, e.Topic)
	}
	return nil
}

// topicString returns b as a string, without allocating for Dynamo's
// topics.
func topicString(b []byte) string {
	for _, t := range [...]string{TopicKVEvents, TopicKVMetrics, TopicForwardPassMetrics, TopicActiveSequences} {
		if string(b) == t {
			return t
		}
	}
	return string(b)
}

// DecodeFrame checks a ZMQ data frame's 5-byte header and returns the
// envelope bytes it frames (aliasing data). Errors wrap ErrMalformed.
func DecodeFrame(data []byte) ([]byte, error) {
	if len(data) < FrameHeaderSize {
		return nil, fmt.Errorf("%w: data frame of %d bytes", ErrMalformed, len(data))
	}
	if data[0] != FrameVersion {
		return nil, fmt.Errorf("%w: frame version %d, want %d", ErrMalformed, data[0], FrameVersion)
	}
	n := binary.BigEndian.Uint32(data[1:FrameHeaderSize])
	if uint64(n) != uint64(len(data)-FrameHeaderSize) {
		return nil, fmt.Errorf("%w: frame header says %d bytes, frame has %d", ErrMalformed, n, len(data)-FrameHeaderSize)
	}
	return data[FrameHeaderSize:], nil
}

// AppendZMQ returns the four frames of a ZMQ event-plane message carrying
// e, as Dynamo's ZMQ transport sends them (topic frame = e.Topic).
func AppendZMQ(e *Envelope) [][]byte {
	var pub, seq [8]byte
	binary.BigEndian.PutUint64(pub[:], e.PublisherID)
	binary.BigEndian.PutUint64(seq[:], e.Sequence)
	body := AppendEnvelope(make([]byte, FrameHeaderSize, 64+len(e.Payload)), e)
	body[0] = FrameVersion
	binary.BigEndian.PutUint32(body[1:FrameHeaderSize], uint32(len(body)-FrameHeaderSize))
	return [][]byte{[]byte(e.Topic), pub[:], seq[:], body}
}

// DecodeRouterEvents decodes a "kv-events" payload, a msgpack list of
// RouterEvents (see kvevents.DecodeDynamoEvent), appending them to dst
// (reusing its elements' slices) and returning it. On error dst holds the
// events decoded before the bad one; the caller should skip the whole
// payload. Errors wrap ErrMalformed (and kvevents.ErrMalformed for a bad
// event).
func DecodeRouterEvents(dst []kvevents.DynamoEvent, payload []byte) ([]kvevents.DynamoEvent, error) {
	n, p, err := msgp.ReadArrayHeaderBytes(payload)
	if err != nil {
		return dst, fmt.Errorf("%w: router events: %w", ErrMalformed, err)
	}
	// A RouterEvent takes at least 16 bytes: refuse counts the payload
	// cannot hold before growing dst.
	if int64(n)*16 > int64(len(p)) {
		return dst, fmt.Errorf("%w: %d router events in %d bytes", ErrMalformed, n, len(p))
	}
	for range n {
		var d *kvevents.DynamoEvent
		if len(dst) < cap(dst) {
			dst = dst[:len(dst)+1]
		} else {
			dst = append(dst, kvevents.DynamoEvent{})
		}
		d = &dst[len(dst)-1]
		if p, err = kvevents.DecodeDynamoEvent(p, d); err != nil {
			return dst[:len(dst)-1], fmt.Errorf("%w: router event: %w", ErrMalformed, err)
		}
	}
	if len(p) != 0 {
		return dst, fmt.Errorf("%w: %d bytes after the router events", ErrMalformed, len(p))
	}
	return dst, nil
}

// AppendRouterEvents appends evs as a "kv-events" payload.
func AppendRouterEvents(dst []byte, evs []kvevents.DynamoEvent) ([]byte, error) {
	dst = msgp.AppendArrayHeader(dst, uint32(len(evs)))
	var err error
	for i := range evs {
		if dst, err = kvevents.AppendDynamoEvent(dst, &evs[i]); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// readMap reads a msgpack map with string keys, calling fn for each value,
// and returns the bytes after it.
func readMap(p []byte, what string, fn func(key, p []byte) ([]byte, error)) ([]byte, error) {
	n, p, err := msgp.ReadMapHeaderBytes(p)
	if err != nil {
		return p, fmt.Errorf("%w: %s: %w", ErrMalformed, what, err)
	}
	if int64(n)*2 > int64(len(p)) {
		return p, fmt.Errorf("%w: %s: %d map entries in %d bytes", ErrMalformed, what, n, len(p))
	}
	for range n {
		var key []byte
		if key, p, err = msgp.ReadStringZC(p); err != nil {
			return p, fmt.Errorf("%w: %s key: %w", ErrMalformed, what, err)
		}
		if p, err = fn(key, p); err != nil {
			if errors.Is(err, ErrMalformed) {
				return p, err
			}
			return p, fmt.Errorf("%w: %s.%s: %w", ErrMalformed, what, key, err)
		}
	}
	return p, nil
}
