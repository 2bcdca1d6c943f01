package natsx

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/tinylib/msgp/msgp"
	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/scheduling"
)

// Every message below is a msgpack array; decoders check lengths against
// the bytes left before allocating, and wrap kvevents.ErrMalformed.
//
// Arrays are of two sorts. A list (of operations, of worker IDs, of
// blocks, of events) has as many elements as it has items. A record (a
// message, a worker-ID entry, a load operation, an active request) has
// one element per field, in order: a newer version of the wire only
// appends fields to a record, and decoders read the fields they know and
// skip the elements after them, so that a newer replica's or relay's
// messages never break an older reader. A change that an older reader
// would misread instead gets a new major wire version (see WireVersion).

// WireVersion is the newest major version of the wire this package
// writes and reads. Every message of the package's own (all but the
// events, which are Dynamo's RouterEvents) carries, in the
// WireVersionHeader NATS header when the server supports headers, the
// oldest major version whose readers read it right: 2 for a dump chunk
// whose Stored events carry sequence hashes (dumpChunk.seqHashes, new in
// version 2), 1 for every other message, so that readers of version 1
// still take them during an upgrade. A message without the header is of
// version 1, as written before the header existed. Fields appended to
// records keep the major version (older readers skip them); any change
// an older reader would misread takes the next one, and a reader drops a
// message of a newer major version than its own with an error wrapping
// errWireVersion (counted in ReplicaStats.NewerWire), never reading it.
const WireVersion = 2

// firstWireVersion is the major version of every message that a reader
// of version 1 reads right.
const firstWireVersion = 1

// WireVersionHeader is the NATS header that carries a message's major
// wire version, a decimal number.
const WireVersionHeader = "Kvroute-Natsx-Wire"

// errWireVersion is wrapped by checkWire's error for a message of a newer
// major wire version than WireVersion.
var errWireVersion = errors.New("natsx: message of a newer wire version")

// checkWire returns nil when a message with header h (nil: none) is of a
// wire version this package reads, an error wrapping errWireVersion when
// it is of a newer major version, and one wrapping kvevents.ErrMalformed
// when its version is not a version number.
func checkWire(h nats.Header) error {
	v := h.Get(WireVersionHeader)
	if v == "" {
		return nil // version 1, before the header
	}
	n, err := strconv.ParseUint(v, 10, 32)
	switch {
	case err != nil || n == 0:
		return malformed("wire version", fmt.Errorf("%q", v))
	case n > WireVersion:
		return fmt.Errorf("%w: version %d, this reads version %d", errWireVersion, n, WireVersion)
	}
	return nil
}

// EpochHeader is the NATS header of a Publisher's new-sequence marker
// that carries the Publisher's epoch (a decimal number), so that replicas
// know at once whose sequence follows. Events carry no other header.
const EpochHeader = "Kvroute-Natsx-Epoch"

// markerEpoch returns the epoch a marker's header h carries, or 0 when it
// carries none (a relay of an older version) or not a number.
func markerEpoch(h nats.Header) uint64 {
	e, err := strconv.ParseUint(h.Get(EpochHeader), 10, 64)
	if err != nil {
		return 0
	}
	return e
}

// publishWire publishes data on subject (with reply as its reply subject,
// when not empty), marked as of wire version 1 when the server takes
// headers.
func publishWire(conn *nats.Conn, subject, reply string, data []byte) error {
	return publishVersion(conn, subject, reply, data, firstWireVersion)
}

// publishVersion is publishWire for a message of the given major wire
// version.
func publishVersion(conn *nats.Conn, subject, reply string, data []byte, version int) error {
	m := &nats.Msg{Subject: subject, Reply: reply, Data: data}
	if conn.HeadersSupported() {
		m.Header = nats.Header{WireVersionHeader: []string{strconv.Itoa(version)}}
	}
	return conn.PublishMsg(m)
}

// Load operations carried on the load subject.
const (
	opAdd         = 1
	opPrefillDone = 2
	opFree        = 3
	opOutput      = 4
)

// loadOp is one change to the active-request load, as a router made it.
type loadOp struct {
	op            uint8
	id            scheduling.RequestID // the origin router's request id
	worker        kvroute.WorkerKey    // opAdd only
	prefillTokens int                  // opAdd only
	prefillDone   bool                 // opAdd in a snapshot: its prefill already completed
	output        int                  // opOutput: new tokens; opAdd in a snapshot: tokens so far
	blocks        []kvroute.SeqHash    // opAdd only
}

// LocalID maps a request id of router origin to the RequestID every
// other replica's tracker uses for it: XXH3-64 of the origin and the id.
// Request ids of different routers may collide; their local ids
// practically do not, nor do they collide with a router's own small
// sequential ids.
func LocalID(origin string, id scheduling.RequestID) scheduling.RequestID {
	var b [8]byte
	for i := range b {
		b[i] = byte(uint64(id) >> (8 * i))
	}
	return scheduling.RequestID(xxh3.HashSeed(b[:], xxh3.HashString(origin)))
}

// malformed wraps kvevents.ErrMalformed with what was being read.
func malformed(what string, err error) error {
	if err == nil {
		return fmt.Errorf("%w: %s", kvevents.ErrMalformed, what)
	}
	return fmt.Errorf("%w: %s: %w", kvevents.ErrMalformed, what, err)
}

// recordOf reads the array header of a record of at least n fields and
// returns how many elements follow the n (fields of a newer version,
// which skipFields passes over).
func recordOf(p []byte, n uint32, what string) (uint32, []byte, error) {
	m, p, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil {
		return 0, p, malformed(what, err)
	}
	if m < n {
		return 0, p, malformed(what, fmt.Errorf("%d elements, want at least %d", m, n))
	}
	return m - n, p, nil
}

// skipFields passes over the extra trailing elements of a record whose
// known fields have been read.
func skipFields(p []byte, extra uint32, what string) ([]byte, error) {
	for range extra {
		var err error
		if p, err = msgp.Skip(p); err != nil {
			return p, malformed(what+": unknown field", err)
		}
	}
	return p, nil
}

// listOf reads an array header whose elements take at least min bytes each.
func listOf(p []byte, min int, what string) (uint32, []byte, error) {
	n, p, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil {
		return 0, p, malformed(what, err)
	}
	if int64(n)*int64(min) > int64(len(p)) {
		return 0, p, malformed(what, fmt.Errorf("%d elements in %d bytes", n, len(p)))
	}
	return n, p, nil
}

func appendWorker(dst []byte, w kvroute.WorkerKey) []byte {
	dst = msgp.AppendUint64(dst, uint64(w.ID))
	return msgp.AppendUint32(dst, uint32(w.Rank))
}

func readWorker(p []byte) (kvroute.WorkerKey, []byte, error) {
	id, p, err := msgp.ReadUint64Bytes(p)
	if err != nil {
		return kvroute.WorkerKey{}, p, malformed("worker id", err)
	}
	rank, p, err := msgp.ReadUint32Bytes(p)
	if err != nil {
		return kvroute.WorkerKey{}, p, malformed("worker rank", err)
	}
	return kvroute.WorkerKey{ID: kvroute.WorkerID(id), Rank: kvroute.DPRank(rank)}, p, nil
}

// workerID is a worker and an event ID: its last one, or the one asked for.
// epoch, when not 0, is the Publisher whose sequence id belongs to (see
// heads): dumps and repair requests carry it, so that a replica on an old
// relay's sequence is not taken for one in sync with the new relay's.
type workerID struct {
	worker kvroute.WorkerKey
	id     uint64
	epoch  uint64
}

// appendWorkerIDs encodes l as [[worker, rank, id] or [worker, rank, id,
// epoch], ...]: an entry carries its epoch only when it is known, so the
// messages without epochs (heads, which carry one for all) keep the
// encoding that readers without epochs accept. Readers take a 4th field
// as the epoch (0: not known) and skip any after it; a version that
// appends fields to an entry therefore writes the epoch, 0 when it is
// not known.
func appendWorkerIDs(dst []byte, l []workerID) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(l)))
	for _, x := range l {
		if x.epoch == 0 {
			dst = msgp.AppendArrayHeader(dst, 3)
		} else {
			dst = msgp.AppendArrayHeader(dst, 4)
		}
		dst = appendWorker(dst, x.worker)
		dst = msgp.AppendUint64(dst, x.id)
		if x.epoch != 0 {
			dst = msgp.AppendUint64(dst, x.epoch)
		}
	}
	return dst
}

func readWorkerIDs(p []byte) ([]workerID, []byte, error) {
	n, p, err := listOf(p, 4, "worker ids")
	if err != nil {
		return nil, p, err
	}
	out := make([]workerID, 0, n)
	for range n {
		var x workerID
		var extra uint32
		if extra, p, err = recordOf(p, 3, "worker id entry"); err != nil {
			return nil, p, err
		}
		if x.worker, p, err = readWorker(p); err != nil {
			return nil, p, err
		}
		if x.id, p, err = msgp.ReadUint64Bytes(p); err != nil {
			return nil, p, malformed("event id", err)
		}
		if extra > 0 { // the epoch, since the 4th field was added
			if x.epoch, p, err = msgp.ReadUint64Bytes(p); err != nil {
				return nil, p, malformed("epoch", err)
			}
			extra--
		}
		if p, err = skipFields(p, extra, "worker id entry"); err != nil {
			return nil, p, err
		}
		out = append(out, x)
	}
	return out, p, nil
}

// appendLoadOp encodes [op, id, worker, rank, prefill, done, output, [blocks]].
func appendLoadOp(dst []byte, o *loadOp) []byte {
	dst = msgp.AppendArrayHeader(dst, 8)
	dst = msgp.AppendUint8(dst, o.op)
	dst = msgp.AppendUint64(dst, uint64(o.id))
	dst = appendWorker(dst, o.worker)
	dst = msgp.AppendInt(dst, o.prefillTokens)
	dst = msgp.AppendBool(dst, o.prefillDone)
	dst = msgp.AppendInt(dst, o.output)
	dst = msgp.AppendArrayHeader(dst, uint32(len(o.blocks)))
	for _, b := range o.blocks {
		dst = msgp.AppendUint64(dst, uint64(b))
	}
	return dst
}

func readLoadOp(p []byte) (loadOp, []byte, error) {
	var o loadOp
	extra, p, err := recordOf(p, 8, "load op")
	if err != nil {
		return o, p, err
	}
	var id uint64
	if o.op, p, err = msgp.ReadUint8Bytes(p); err == nil {
		id, p, err = msgp.ReadUint64Bytes(p)
	}
	if err != nil {
		return o, p, malformed("load op", err)
	}
	if o.worker, p, err = readWorker(p); err != nil {
		return o, p, err
	}
	if o.prefillTokens, p, err = msgp.ReadIntBytes(p); err == nil {
		if o.prefillDone, p, err = msgp.ReadBoolBytes(p); err == nil {
			o.output, p, err = msgp.ReadIntBytes(p)
		}
	}
	if err != nil {
		return o, p, malformed("load op", err)
	}
	if o.op < opAdd || o.op > opOutput || o.prefillTokens < 0 || o.output < 0 {
		return o, p, malformed("load op", fmt.Errorf("op %d, prefill %d, output %d", o.op, o.prefillTokens, o.output))
	}
	o.id = scheduling.RequestID(id)
	n, p, err := listOf(p, 1, "load op blocks")
	if err != nil {
		return o, p, err
	}
	if n > 0 {
		o.blocks = make([]kvroute.SeqHash, n)
		for i := range o.blocks {
			var b uint64
			if b, p, err = msgp.ReadUint64Bytes(p); err != nil {
				return o, p, malformed("load op block", err)
			}
			o.blocks[i] = kvroute.SeqHash(b)
		}
	}
	p, err = skipFields(p, extra, "load op")
	return o, p, err
}

// loadBatch is one message on the load subject: the operations a router
// made since its last batch, numbered by seq per incarnation. A batch
// without operations is a heartbeat carrying the current seq.
type loadBatch struct {
	origin      string
	incarnation uint64
	seq         uint64
	ops         []loadOp
}

func appendLoadBatch(dst []byte, b *loadBatch) []byte {
	dst = msgp.AppendArrayHeader(dst, 4)
	dst = msgp.AppendString(dst, b.origin)
	dst = msgp.AppendUint64(dst, b.incarnation)
	dst = msgp.AppendUint64(dst, b.seq)
	dst = msgp.AppendArrayHeader(dst, uint32(len(b.ops)))
	for i := range b.ops {
		dst = appendLoadOp(dst, &b.ops[i])
	}
	return dst
}

// decodeLoadBatch decodes p into b, reusing b.ops.
func decodeLoadBatch(p []byte, b *loadBatch) error {
	extra, p, err := recordOf(p, 4, "load batch")
	if err != nil {
		return err
	}
	if b.origin, p, err = msgp.ReadStringBytes(p); err != nil {
		return malformed("load batch origin", err)
	}
	if b.incarnation, p, err = msgp.ReadUint64Bytes(p); err == nil {
		b.seq, p, err = msgp.ReadUint64Bytes(p)
	}
	if err != nil {
		return malformed("load batch", err)
	}
	n, p, err := listOf(p, 9, "load ops")
	if err != nil {
		return err
	}
	b.ops = b.ops[:0]
	for range n {
		var o loadOp
		if o, p, err = readLoadOp(p); err != nil {
			return err
		}
		b.ops = append(b.ops, o)
	}
	_, err = skipFields(p, extra, "load batch")
	return err
}

// activeReq is a request in an active snapshot: its operation as an add
// (with its prefill state and output so far) and the time it has left
// before it expires.
type activeReq struct {
	ttlMillis int64
	op        loadOp
}

// activeChunk is one chunk of a router's active-request snapshot, the
// answer to a request on "<prefix>.active.<origin>".
type activeChunk struct {
	index       uint64
	final       bool
	incarnation uint64
	seq         uint64 // the last load batch the snapshot includes
	reqs        []activeReq
}

func appendActiveChunk(dst []byte, c *activeChunk) []byte {
	dst = msgp.AppendArrayHeader(dst, 5)
	dst = msgp.AppendUint64(dst, c.index)
	dst = msgp.AppendBool(dst, c.final)
	dst = msgp.AppendUint64(dst, c.incarnation)
	dst = msgp.AppendUint64(dst, c.seq)
	dst = msgp.AppendArrayHeader(dst, uint32(len(c.reqs)))
	for i := range c.reqs {
		dst = msgp.AppendArrayHeader(dst, 2)
		dst = msgp.AppendInt64(dst, c.reqs[i].ttlMillis)
		dst = appendLoadOp(dst, &c.reqs[i].op)
	}
	return dst
}

func decodeActiveChunk(p []byte) (*activeChunk, error) {
	c := &activeChunk{}
	extra, p, err := recordOf(p, 5, "active chunk")
	if err != nil {
		return nil, err
	}
	if c.index, p, err = msgp.ReadUint64Bytes(p); err == nil {
		if c.final, p, err = msgp.ReadBoolBytes(p); err == nil {
			if c.incarnation, p, err = msgp.ReadUint64Bytes(p); err == nil {
				c.seq, p, err = msgp.ReadUint64Bytes(p)
			}
		}
	}
	if err != nil {
		return nil, malformed("active chunk", err)
	}
	n, p, err := listOf(p, 10, "active requests")
	if err != nil {
		return nil, err
	}
	for range n {
		var a activeReq
		var reqExtra uint32
		if reqExtra, p, err = recordOf(p, 2, "active request"); err != nil {
			return nil, err
		}
		if a.ttlMillis, p, err = msgp.ReadInt64Bytes(p); err != nil {
			return nil, malformed("active request ttl", err)
		}
		if a.op, p, err = readLoadOp(p); err != nil {
			return nil, err
		}
		if a.op.op != opAdd {
			return nil, malformed("active request", fmt.Errorf("op %d", a.op.op))
		}
		if p, err = skipFields(p, reqExtra, "active request"); err != nil {
			return nil, err
		}
		c.reqs = append(c.reqs, a)
	}
	if _, err = skipFields(p, extra, "active chunk"); err != nil {
		return nil, err
	}
	return c, nil
}

// dumpChunk is one chunk of an index dump: of every worker (a starting
// replica's request on "<prefix>.dump") or of one (a repair's request on
// "<prefix>.wdump.<peer>"). Only chunk 0 carries the last event IDs, each
// with its relay's epoch when the dumping replica knows it.
//
// With seqHashes set (a fifth field, new in wire version 2) the
// tokens_hash of every block of the chunk's Stored events is the block's
// sequence hash (kvroute.Event.SeqHashes), as an index that keeps no
// content hashes dumps them; such a chunk is of wire version 2, since a
// reader of version 1 would take the hashes for content hashes. Without
// it they are content hashes, and the chunk is written as in version 1.
type dumpChunk struct {
	index     uint64
	final     bool
	last      []workerID
	events    []kvevents.DynamoEvent
	seqHashes bool
}

// wireVersion returns the major wire version of c's message.
func (c *dumpChunk) wireVersion() int {
	if c.seqHashes {
		return 2
	}
	return firstWireVersion
}

func appendDumpChunk(dst []byte, c *dumpChunk) ([]byte, error) {
	fields := uint32(4)
	if c.seqHashes {
		fields = 5
	}
	dst = msgp.AppendArrayHeader(dst, fields)
	dst = msgp.AppendUint64(dst, c.index)
	dst = msgp.AppendBool(dst, c.final)
	dst = appendWorkerIDs(dst, c.last)
	dst = msgp.AppendArrayHeader(dst, uint32(len(c.events)))
	for i := range c.events {
		var err error
		if dst, err = kvevents.AppendDynamoEvent(dst, &c.events[i]); err != nil {
			return dst, err
		}
	}
	if c.seqHashes {
		dst = msgp.AppendBool(dst, true)
	}
	return dst, nil
}

func decodeDumpChunk(p []byte) (*dumpChunk, error) {
	c := &dumpChunk{}
	extra, p, err := recordOf(p, 4, "dump chunk")
	if err != nil {
		return nil, err
	}
	if c.index, p, err = msgp.ReadUint64Bytes(p); err == nil {
		c.final, p, err = msgp.ReadBoolBytes(p)
	}
	if err != nil {
		return nil, malformed("dump chunk", err)
	}
	if c.last, p, err = readWorkerIDs(p); err != nil {
		return nil, err
	}
	n, p, err := listOf(p, 1, "dump events")
	if err != nil {
		return nil, err
	}
	c.events = make([]kvevents.DynamoEvent, n)
	for i := range c.events {
		if p, err = kvevents.DecodeDynamoEvent(p, &c.events[i]); err != nil {
			return nil, err
		}
	}
	if extra > 0 {
		if c.seqHashes, p, err = msgp.ReadBoolBytes(p); err != nil {
			return nil, malformed("dump chunk hashes", err)
		}
		extra--
	}
	if _, err = skipFields(p, extra, "dump chunk"); err != nil {
		return nil, err
	}
	return c, nil
}

// haveReq asks the peers on "<prefix>.have" which of them holds worker's
// events through id, of the relay of want.epoch when it is not 0, for a
// repair; those that do answer with their ID.
type haveReq struct {
	from string // the asking replica
	want workerID
}

func appendHaveReq(dst []byte, h *haveReq) []byte {
	dst = msgp.AppendArrayHeader(dst, 2)
	dst = msgp.AppendString(dst, h.from)
	return appendWorkerIDs(dst, []workerID{h.want})
}

func decodeHaveReq(p []byte) (haveReq, error) {
	var h haveReq
	extra, p, err := recordOf(p, 2, "have request")
	if err != nil {
		return h, err
	}
	if h.from, p, err = msgp.ReadStringBytes(p); err != nil {
		return h, malformed("have request", err)
	}
	l, p, err := readWorkerIDs(p)
	if err != nil {
		return h, err
	}
	if len(l) != 1 {
		return h, malformed("have request", fmt.Errorf("%d workers", len(l)))
	}
	if _, err = skipFields(p, extra, "have request"); err != nil {
		return h, err
	}
	h.want = l[0]
	return h, nil
}

// heads is the relay's periodic announcement on "<prefix>.heads" of the
// last event ID it published per worker, so that replicas notice events
// lost at the end of a burst; epoch identifies the Publisher instance.
type heads struct {
	epoch uint64
	last  []workerID
}

func appendHeads(dst []byte, h *heads) []byte {
	dst = msgp.AppendArrayHeader(dst, 2)
	dst = msgp.AppendUint64(dst, h.epoch)
	return appendWorkerIDs(dst, h.last)
}

func decodeHeads(p []byte) (heads, error) {
	var h heads
	extra, p, err := recordOf(p, 2, "heads")
	if err != nil {
		return h, err
	}
	if h.epoch, p, err = msgp.ReadUint64Bytes(p); err != nil {
		return h, malformed("heads epoch", err)
	}
	if h.last, p, err = readWorkerIDs(p); err != nil {
		return heads{}, err
	}
	if _, err = skipFields(p, extra, "heads"); err != nil {
		return heads{}, err
	}
	return h, nil
}

// replayReq asks the relay on "<prefix>.replay" for worker's events with
// IDs from..to (inclusive).
type replayReq struct {
	worker   kvroute.WorkerKey
	from, to uint64
}

func appendReplayReq(dst []byte, r *replayReq) []byte {
	dst = msgp.AppendArrayHeader(dst, 4)
	dst = appendWorker(dst, r.worker)
	dst = msgp.AppendUint64(dst, r.from)
	return msgp.AppendUint64(dst, r.to)
}

func decodeReplayReq(p []byte) (replayReq, error) {
	var r replayReq
	extra, p, err := recordOf(p, 4, "replay request")
	if err != nil {
		return r, err
	}
	if r.worker, p, err = readWorker(p); err != nil {
		return r, err
	}
	if r.from, p, err = msgp.ReadUint64Bytes(p); err == nil {
		r.to, p, err = msgp.ReadUint64Bytes(p)
	}
	if err != nil {
		return r, malformed("replay request", err)
	}
	if r.from == 0 || r.to < r.from {
		return r, malformed("replay request", fmt.Errorf("range %d..%d", r.from, r.to))
	}
	_, err = skipFields(p, extra, "replay request")
	return r, err
}

// replayChunk is one chunk of the relay's answer: the event messages as
// published, in order. ok is false when the relay no longer holds the
// range (then the chunk is final and empty).
type replayChunk struct {
	index uint64
	final bool
	ok    bool
	msgs  [][]byte
}

func appendReplayChunk(dst []byte, c *replayChunk) []byte {
	dst = msgp.AppendArrayHeader(dst, 4)
	dst = msgp.AppendUint64(dst, c.index)
	dst = msgp.AppendBool(dst, c.final)
	dst = msgp.AppendBool(dst, c.ok)
	dst = msgp.AppendArrayHeader(dst, uint32(len(c.msgs)))
	for _, m := range c.msgs {
		dst = msgp.AppendBytes(dst, m)
	}
	return dst
}

func decodeReplayChunk(p []byte) (*replayChunk, error) {
	c := &replayChunk{}
	extra, p, err := recordOf(p, 4, "replay chunk")
	if err != nil {
		return nil, err
	}
	if c.index, p, err = msgp.ReadUint64Bytes(p); err == nil {
		if c.final, p, err = msgp.ReadBoolBytes(p); err == nil {
			c.ok, p, err = msgp.ReadBoolBytes(p)
		}
	}
	if err != nil {
		return nil, malformed("replay chunk", err)
	}
	n, p, err := listOf(p, 1, "replay messages")
	if err != nil {
		return nil, err
	}
	for range n {
		var m []byte
		if m, p, err = msgp.ReadBytesZC(p); err != nil {
			return nil, malformed("replay message", err)
		}
		c.msgs = append(c.msgs, m)
	}
	if _, err = skipFields(p, extra, "replay chunk"); err != nil {
		return nil, err
	}
	return c, nil
}

// errNotAvailable is a repair step that could not get what it asked for.
var errNotAvailable = errors.New("natsx: not available")
