package dynamo

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute/kvevents"
)

// ErrQuery is wrapped by the errors of Query: the worker could not be
// asked, or answered with an error.
var ErrQuery = errors.New("dynamo: worker KV query failed")

// ErrResetScope is wrapped by the error a subscriber records when a worker
// answers a dump with a reset_scope other than "all": kvroute restores a
// worker only from a dump that replaces everything known of it, so it does
// not apply such a dump, and gives up recovering that worker (its events
// are applied as without recovery).
var ErrResetScope = errors.New("dynamo: tree dump of a partial reset scope")

// ResetScopeAll is the reset_scope of a dump that holds the worker's whole
// cache: what is known of the worker is replaced by it. A dump without the
// field is read as this scope.
const ResetScopeAll = "all"

// checkResetScope returns nil for a dump that replaces everything known of
// its worker, else an error wrapping ErrResetScope and ErrQuery.
func checkResetScope(scope string) error {
	if scope == "" || scope == ResetScopeAll {
		return nil
	}
	return fmt.Errorf("%w: %w: reset_scope %s, only %q is supported", ErrQuery, ErrResetScope, strconv.Quote(scope), ResetScopeAll)
}

// DefaultQueryTimeout bounds a worker KV query when Querier.Timeout is zero.
const DefaultQueryTimeout = 5 * time.Second

// maxQueryMessage bounds one message of a query's response stream.
const maxQueryMessage = 256 << 20

// RecoveryTarget is a worker's KV query endpoint on Dynamo's TCP request
// plane: the recovery_target of its kv-events publisher in
// v1/event_sources (Dynamo workers with a local indexer serve it).
type RecoveryTarget struct {
	// Address is the request plane's host:port.
	Address string
	// Path is the endpoint path after the address, such as
	// "3e17825d9dc5e29d/dynamo/backend/worker_kv_query_source_1913718791a03c".
	Path string
	// WorkerID and DPRank name the worker queried.
	WorkerID uint64
	DPRank   uint32
}

// ParseRecoveryTarget builds a RecoveryTarget from a record's
// transport.tcp ("host:port/path") and the worker it names. It returns an
// error wrapping ErrConfig for an address without a path.
func ParseRecoveryTarget(tcp string, workerID uint64, dpRank uint32) (RecoveryTarget, error) {
	addr, path, ok := strings.Cut(tcp, "/")
	if !ok || addr == "" || path == "" {
		return RecoveryTarget{}, fmt.Errorf("%w: recovery transport %q is not host:port/path", ErrConfig, tcp)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return RecoveryTarget{}, fmt.Errorf("%w: recovery transport %q: %w", ErrConfig, tcp, err)
	}
	return RecoveryTarget{Address: addr, Path: path, WorkerID: workerID, DPRank: dpRank}, nil
}

// QueryResponse is a worker's answer to a KV query (Dynamo's
// WorkerKvQueryResponse).
type QueryResponse struct {
	// Kind is the response variant: "TreeDump" (the worker's whole cache,
	// replacing what is known of it), "Events" (the events asked for), or
	// another variant Dynamo defines (no events).
	Kind string
	// Events are the RouterEvents of the response, in order.
	Events []kvevents.DynamoEvent
	// LastEventID is last_event_id: the worker's last event the response
	// accounts for.
	LastEventID uint64
	// ResetScope is reset_scope of a TreeDump: ResetScopeAll (or empty,
	// from a worker that does not send the field) for a dump of the
	// worker's whole cache. A subscriber refuses other scopes
	// (ErrResetScope).
	ResetScope string
}

// Querier asks Dynamo workers' local indexers for KV events over Dynamo's
// TCP request plane, as Dynamo's router does to recover: it sends the
// request to the worker's endpoint and receives the response stream on a
// TCP connection the worker opens back to it.
type Querier struct {
	// CallbackHost is the address the worker connects back to (Dynamo's
	// DYN_TCP_RESPONSE_STREAM_HOST); it must be reachable from the
	// worker. Empty means 127.0.0.1.
	CallbackHost string
	// Timeout bounds one query. Zero means DefaultQueryTimeout.
	Timeout time.Duration
}

// Query asks the worker t for its events with ids in [start, end] (nil
// bounds: from its first, up to its last; both nil asks for a dump of its
// whole cache). Errors wrap ErrQuery (or ErrMalformed for a response that
// does not decode).
func (q *Querier) Query(ctx context.Context, t RecoveryTarget, start, end *uint64) (*QueryResponse, error) {
	timeout := q.Timeout
	if timeout <= 0 {
		timeout = DefaultQueryTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	host := q.CallbackHost
	if host == "" {
		host = "127.0.0.1"
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("%w: callback listener: %w", ErrQuery, err)
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()

	id, subject := newUUID(), newUUID()
	frame, err := queryFrame(t, id, subject, ln.Addr().String(), start, end)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", t.Address)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrQuery, err)
	}
	defer conn.Close()
	stopConn := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopConn()
	if _, err := conn.Write(frame); err != nil {
		return nil, fmt.Errorf("%w: send: %w", ErrQuery, err)
	}
	var ack [4]byte
	if _, err := io.ReadFull(conn, ack[:]); err != nil {
		return nil, fmt.Errorf("%w: acknowledgement: %w", ErrQuery, err)
	}
	if a := binary.BigEndian.Uint32(ack[:]); a != 0 {
		return nil, fmt.Errorf("%w: request refused (acknowledgement %d)", ErrQuery, a)
	}
	cb, err := ln.Accept()
	if err != nil {
		return nil, fmt.Errorf("%w: response stream: %w", ErrQuery, err)
	}
	defer cb.Close()
	stopCb := context.AfterFunc(ctx, func() { cb.Close() })
	defer stopCb()
	return readQueryStream(bufio.NewReader(cb), subject)
}

// queryFrame builds a request for Dynamo's TCP request plane: the endpoint
// path, JSON headers and a two-part message (control header, msgpack
// body), each length-prefixed.
func queryFrame(t RecoveryTarget, id, subject, callback string, start, end *uint64) ([]byte, error) {
	info, err := json.Marshal(map[string]string{"address": callback, "subject": subject, "context": id, "stream_type": "response"})
	if err != nil {
		return nil, err
	}
	ctrl, err := json.Marshal(map[string]any{
		"id": id, "request_type": "single_in", "response_type": "many_out", "payload_codec": "msgpack",
		"connection_info": map[string]string{"transport": "tcp_server", "info": string(info)},
	})
	if err != nil {
		return nil, err
	}
	body := msgp.AppendMapHeader(nil, 4)
	body = msgp.AppendString(body, "worker_id")
	body = msgp.AppendUint64(body, t.WorkerID)
	body = msgp.AppendString(body, "dp_rank")
	body = msgp.AppendUint32(body, t.DPRank)
	for _, b := range []struct {
		k string
		v *uint64
	}{{"start_event_id", start}, {"end_event_id", end}} {
		body = msgp.AppendString(body, b.k)
		if b.v == nil {
			body = msgp.AppendNil(body)
		} else {
			body = msgp.AppendUint64(body, *b.v)
		}
	}
	headers, err := json.Marshal(map[string]string{"x-endpoint-path": t.Path, "request-id": id})
	if err != nil {
		return nil, err
	}
	if len(t.Path) > 0xffff || len(headers) > 0xffff {
		return nil, fmt.Errorf("%w: endpoint path or headers too long", ErrConfig)
	}
	out := binary.BigEndian.AppendUint16(nil, uint16(len(t.Path)))
	out = append(out, t.Path...)
	out = binary.BigEndian.AppendUint16(out, uint16(len(headers)))
	out = append(out, headers...)
	out = binary.BigEndian.AppendUint32(out, uint32(24+len(ctrl)+len(body)))
	out = appendTwoPart(out, ctrl, body)
	return out, nil
}

// appendTwoPart appends Dynamo's two-part message: header length, body
// length (8 bytes each, big-endian), a zero checksum, header, body.
func appendTwoPart(dst, header, body []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(len(header)))
	dst = binary.BigEndian.AppendUint64(dst, uint64(len(body)))
	dst = binary.BigEndian.AppendUint64(dst, 0)
	dst = append(dst, header...)
	return append(dst, body...)
}

// readTwoPart reads one two-part message.
func readTwoPart(r *bufio.Reader) (header, body []byte, err error) {
	var h [24]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, nil, err
	}
	hl, bl := binary.BigEndian.Uint64(h[0:8]), binary.BigEndian.Uint64(h[8:16])
	if hl > maxQueryMessage || bl > maxQueryMessage {
		return nil, nil, fmt.Errorf("%w: response message of %d+%d bytes", ErrMalformed, hl, bl)
	}
	buf, err := readN(r, hl+bl)
	if err != nil {
		return nil, nil, err
	}
	return buf[:hl], buf[hl:], nil
}

// readN reads exactly n bytes. Memory grows with the bytes that arrive,
// not with n, so that a length a peer declares but never sends costs
// nothing.
func readN(r io.Reader, n uint64) ([]byte, error) {
	const direct = 64 << 10
	if n <= direct {
		buf := make([]byte, n)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return buf, nil
	}
	var b bytes.Buffer
	b.Grow(direct)
	m, err := b.ReadFrom(io.LimitReader(r, int64(n)))
	if err != nil {
		return nil, err
	}
	if uint64(m) < n {
		return nil, io.ErrUnexpectedEOF
	}
	return b.Bytes(), nil
}

// readQueryStream reads a query's response stream: the worker's handshake
// (naming subject), a prologue (an error or none), then msgpack responses
// until one marks complete_final.
func readQueryStream(r *bufio.Reader, subject string) (*QueryResponse, error) {
	hdr, _, err := readTwoPart(r)
	if err != nil {
		return nil, fmt.Errorf("%w: handshake: %w", ErrQuery, err)
	}
	var hs struct {
		Subject    string `json:"subject"`
		StreamType string `json:"stream_type"`
	}
	if err := json.Unmarshal(hdr, &hs); err != nil || hs.Subject != subject {
		return nil, fmt.Errorf("%w: handshake %q for another stream", ErrQuery, hdr)
	}
	if hdr, _, err = readTwoPart(r); err != nil {
		return nil, fmt.Errorf("%w: prologue: %w", ErrQuery, err)
	}
	var prologue struct {
		Error *json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(hdr, &prologue); err != nil {
		return nil, fmt.Errorf("%w: prologue %q", ErrMalformed, hdr)
	}
	if prologue.Error != nil && string(*prologue.Error) != "null" {
		return nil, fmt.Errorf("%w: worker: %s", ErrQuery, *prologue.Error)
	}
	var resp *QueryResponse
	for {
		_, body, err := readTwoPart(r)
		if err != nil {
			return nil, fmt.Errorf("%w: response: %w", ErrQuery, err)
		}
		if len(body) == 0 {
			continue // a control message
		}
		final, err := decodeQueryItem(body, &resp)
		if err != nil {
			return nil, err
		}
		if final {
			break
		}
	}
	if resp == nil {
		return nil, fmt.Errorf("%w: empty response stream", ErrQuery)
	}
	return resp, nil
}

// decodeQueryItem decodes one item of the response stream, {data:
// {Variant: {...}}, complete_final: bool} or an error item, into *resp.
func decodeQueryItem(p []byte, resp **QueryResponse) (final bool, err error) {
	rest, err := readMap(p, "query response", func(key, p []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "complete_final":
			final, p, err = msgp.ReadBoolBytes(p)
			return p, err
		case "data":
			if msgp.IsNil(p) {
				return p[1:], nil
			}
			*resp = &QueryResponse{}
			return decodeQueryResponse(p, *resp)
		case "error", "err":
			if msgp.IsNil(p) {
				return p[1:], nil
			}
			var o []byte
			if o, err = msgp.Skip(p); err != nil {
				return o, err
			}
			return o, fmt.Errorf("%w: worker: %s", ErrQuery, strconv.Quote(string(p[:len(p)-len(o)])))
		}
		return msgp.Skip(p)
	})
	if err != nil {
		return false, err
	}
	if len(rest) != 0 {
		return false, fmt.Errorf("%w: %d bytes after a query response", ErrMalformed, len(rest))
	}
	return final, nil
}

// decodeQueryResponse decodes an externally tagged WorkerKvQueryResponse.
func decodeQueryResponse(p []byte, r *QueryResponse) ([]byte, error) {
	if msgp.NextType(p) == msgp.StrType { // a unit variant
		s, o, err := msgp.ReadStringZC(p)
		r.Kind = string(s)
		return o, err
	}
	return readMap(p, "worker kv query response", func(key, p []byte) ([]byte, error) {
		r.Kind = string(key)
		if msgp.NextType(p) != msgp.MapType {
			return msgp.Skip(p)
		}
		return readMap(p, r.Kind, func(key, p []byte) ([]byte, error) {
			var err error
			switch string(key) {
			case "events":
				n, o, err := msgp.ReadArrayHeaderBytes(p)
				if err != nil {
					return o, err
				}
				if int64(n)*16 > int64(len(o)) {
					return o, fmt.Errorf("%d events in %d bytes", n, len(o))
				}
				for range n {
					var d kvevents.DynamoEvent
					if o, err = kvevents.DecodeDynamoEvent(o, &d); err != nil {
						return o, err
					}
					r.Events = append(r.Events, d)
				}
				return o, nil
			case "last_event_id":
				if msgp.IsNil(p) {
					return p[1:], nil
				}
				r.LastEventID, p, err = msgp.ReadUint64Bytes(p)
			case "reset_scope":
				var s []byte
				s, p, err = msgp.ReadStringZC(p)
				r.ResetScope = string(s)
			default:
				return msgp.Skip(p)
			}
			return p, err
		})
	})
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
