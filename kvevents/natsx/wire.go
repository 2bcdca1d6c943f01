package natsx

import (
	"fmt"

	"github.com/tinylib/msgp/msgp"
	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/scheduling"
)

// Load operations carried on the load subject.
const (
	opAdd         = 1
	opPrefillDone = 2
	opFree        = 3
)

// loadOp is one change to the active-request load, as a router made it.
type loadOp struct {
	op            uint8
	id            scheduling.RequestID // the origin router's request id
	worker        kvroute.WorkerKey    // opAdd only
	prefillTokens int                  // opAdd only
	prefillDone   bool                 // opAdd in a dump: its prefill already completed
	blocks        []kvroute.SeqHash    // opAdd only
}

// LocalID maps a request id of router origin to the RequestID every
// replica's tracker uses for it: XXH3-64 of the origin and the id. Request
// ids of different routers may collide; their local ids practically do
// not.
func LocalID(origin string, id scheduling.RequestID) scheduling.RequestID {
	var b [8]byte
	for i := range b {
		b[i] = byte(uint64(id) >> (8 * i))
	}
	return scheduling.RequestID(xxh3.HashSeed(b[:], xxh3.HashString(origin)))
}

// appendLoadBatch encodes [origin, [[op, id, worker, rank, prefill, done, [blocks]], ...]].
func appendLoadBatch(dst []byte, origin string, ops []loadOp) []byte {
	dst = msgp.AppendArrayHeader(dst, 2)
	dst = msgp.AppendString(dst, origin)
	dst = msgp.AppendArrayHeader(dst, uint32(len(ops)))
	for i := range ops {
		dst = appendLoadOp(dst, &ops[i])
	}
	return dst
}

func appendLoadOp(dst []byte, o *loadOp) []byte {
	dst = msgp.AppendArrayHeader(dst, 7)
	dst = msgp.AppendUint8(dst, o.op)
	dst = msgp.AppendUint64(dst, uint64(o.id))
	dst = msgp.AppendUint64(dst, uint64(o.worker.ID))
	dst = msgp.AppendUint32(dst, uint32(o.worker.Rank))
	dst = msgp.AppendInt(dst, o.prefillTokens)
	dst = msgp.AppendBool(dst, o.prefillDone)
	dst = msgp.AppendArrayHeader(dst, uint32(len(o.blocks)))
	for _, b := range o.blocks {
		dst = msgp.AppendUint64(dst, uint64(b))
	}
	return dst
}

func decodeLoadBatch(p []byte, ops []loadOp) (string, []loadOp, error) {
	n, p, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil || n != 2 {
		return "", ops, fmt.Errorf("%w: load batch", kvevents.ErrMalformed)
	}
	origin, p, err := msgp.ReadStringBytes(p)
	if err != nil {
		return "", ops, fmt.Errorf("%w: load batch origin: %w", kvevents.ErrMalformed, err)
	}
	ops, _, err = readLoadOps(p, ops)
	return origin, ops, err
}

func readLoadOps(p []byte, ops []loadOp) ([]loadOp, []byte, error) {
	n, p, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil {
		return ops, p, fmt.Errorf("%w: load ops: %w", kvevents.ErrMalformed, err)
	}
	if int64(n)*8 > int64(len(p)) {
		return ops, p, fmt.Errorf("%w: %d load ops in %d bytes", kvevents.ErrMalformed, n, len(p))
	}
	for range n {
		var o loadOp
		if o, p, err = readLoadOp(p); err != nil {
			return ops, p, err
		}
		ops = append(ops, o)
	}
	return ops, p, nil
}

func readLoadOp(p []byte) (loadOp, []byte, error) {
	var o loadOp
	n, p, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil || n != 7 {
		return o, p, fmt.Errorf("%w: load op", kvevents.ErrMalformed)
	}
	var id, wid uint64
	var rank uint32
	var nb uint32
	if o.op, p, err = msgp.ReadUint8Bytes(p); err == nil {
		if id, p, err = msgp.ReadUint64Bytes(p); err == nil {
			if wid, p, err = msgp.ReadUint64Bytes(p); err == nil {
				if rank, p, err = msgp.ReadUint32Bytes(p); err == nil {
					if o.prefillTokens, p, err = msgp.ReadIntBytes(p); err == nil {
						if o.prefillDone, p, err = msgp.ReadBoolBytes(p); err == nil {
							nb, p, err = msgp.ReadArrayHeaderBytes(p)
						}
					}
				}
			}
		}
	}
	if err != nil {
		return o, p, fmt.Errorf("%w: load op: %w", kvevents.ErrMalformed, err)
	}
	if int64(nb) > int64(len(p)) {
		return o, p, fmt.Errorf("%w: %d blocks in %d bytes", kvevents.ErrMalformed, nb, len(p))
	}
	o.id, o.worker = scheduling.RequestID(id), kvroute.WorkerKey{ID: kvroute.WorkerID(wid), Rank: kvroute.DPRank(rank)}
	if nb > 0 {
		o.blocks = make([]kvroute.SeqHash, nb)
		for i := range o.blocks {
			var b uint64
			if b, p, err = msgp.ReadUint64Bytes(p); err != nil {
				return o, p, fmt.Errorf("%w: load op block: %w", kvevents.ErrMalformed, err)
			}
			o.blocks[i] = kvroute.SeqHash(b)
		}
	}
	return o, p, nil
}

// A dump is sent as chunks to the requester's inbox, each
// [index, final, [[worker, rank, lastID], ...], [event, ...], [[origin, loadOp], ...]].
// Only chunk 0 carries last IDs.
type lastID struct {
	worker kvroute.WorkerKey
	id     uint64
}

type originOp struct {
	origin string
	op     loadOp
}

type dumpChunk struct {
	index  uint64
	final  bool
	last   []lastID
	events []kvevents.DynamoEvent
	ops    []originOp
}

func appendDumpChunk(dst []byte, c *dumpChunk) ([]byte, error) {
	dst = msgp.AppendArrayHeader(dst, 5)
	dst = msgp.AppendUint64(dst, c.index)
	dst = msgp.AppendBool(dst, c.final)
	dst = msgp.AppendArrayHeader(dst, uint32(len(c.last)))
	for _, l := range c.last {
		dst = msgp.AppendArrayHeader(dst, 3)
		dst = msgp.AppendUint64(dst, uint64(l.worker.ID))
		dst = msgp.AppendUint32(dst, uint32(l.worker.Rank))
		dst = msgp.AppendUint64(dst, l.id)
	}
	dst = msgp.AppendArrayHeader(dst, uint32(len(c.events)))
	for i := range c.events {
		var err error
		if dst, err = kvevents.AppendDynamoEvent(dst, &c.events[i]); err != nil {
			return dst, err
		}
	}
	dst = msgp.AppendArrayHeader(dst, uint32(len(c.ops)))
	for i := range c.ops {
		dst = msgp.AppendArrayHeader(dst, 2)
		dst = msgp.AppendString(dst, c.ops[i].origin)
		dst = appendLoadOp(dst, &c.ops[i].op)
	}
	return dst, nil
}

func decodeDumpChunk(p []byte) (*dumpChunk, error) {
	bad := func(err error) (*dumpChunk, error) {
		return nil, fmt.Errorf("%w: dump chunk: %w", kvevents.ErrMalformed, err)
	}
	c := &dumpChunk{}
	n, p, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil {
		return bad(err)
	}
	if n != 5 {
		return bad(fmt.Errorf("%d elements", n))
	}
	if c.index, p, err = msgp.ReadUint64Bytes(p); err != nil {
		return bad(err)
	}
	if c.final, p, err = msgp.ReadBoolBytes(p); err != nil {
		return bad(err)
	}
	if n, p, err = msgp.ReadArrayHeaderBytes(p); err != nil {
		return bad(err)
	}
	if int64(n)*4 > int64(len(p)) {
		return bad(fmt.Errorf("%d last ids in %d bytes", n, len(p)))
	}
	for range n {
		var m, rank uint32
		var wid, id uint64
		if m, p, err = msgp.ReadArrayHeaderBytes(p); err != nil || m != 3 {
			return bad(fmt.Errorf("last id entry"))
		}
		if wid, p, err = msgp.ReadUint64Bytes(p); err != nil {
			return bad(err)
		}
		if rank, p, err = msgp.ReadUint32Bytes(p); err != nil {
			return bad(err)
		}
		if id, p, err = msgp.ReadUint64Bytes(p); err != nil {
			return bad(err)
		}
		c.last = append(c.last, lastID{kvroute.WorkerKey{ID: kvroute.WorkerID(wid), Rank: kvroute.DPRank(rank)}, id})
	}
	if n, p, err = msgp.ReadArrayHeaderBytes(p); err != nil {
		return bad(err)
	}
	if int64(n) > int64(len(p)) {
		return bad(fmt.Errorf("%d events in %d bytes", n, len(p)))
	}
	c.events = make([]kvevents.DynamoEvent, n)
	for i := range c.events {
		if p, err = kvevents.DecodeDynamoEvent(p, &c.events[i]); err != nil {
			return nil, err
		}
	}
	if n, p, err = msgp.ReadArrayHeaderBytes(p); err != nil {
		return bad(err)
	}
	if int64(n) > int64(len(p)) {
		return bad(fmt.Errorf("%d ops in %d bytes", n, len(p)))
	}
	for range n {
		var m uint32
		if m, p, err = msgp.ReadArrayHeaderBytes(p); err != nil || m != 2 {
			return bad(fmt.Errorf("op entry"))
		}
		var oo originOp
		if oo.origin, p, err = msgp.ReadStringBytes(p); err != nil {
			return bad(err)
		}
		if oo.op, p, err = readLoadOp(p); err != nil {
			return nil, err
		}
		c.ops = append(c.ops, oo)
	}
	return c, nil
}
