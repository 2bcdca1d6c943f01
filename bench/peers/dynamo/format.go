package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/kvroute/kvroute"
)

// The workload file format, read by both sides. All integers are
// little-endian.
//
//	file     = magic "KVPEER01", u32 block size, u32 section count, sections
//	section  = u16 name length, name, u8 flags (bit 0: timed),
//	           u8 metric (0: per operation, 1: per block-operation),
//	           u32 repeat (passes over the operations; >1 only without events),
//	           u64 operation count, operations
//	Stored   = u8 1, u64 worker, u64 event id, u8 has parent, u64 parent,
//	           u32 n, n × (u64 local hash, u64 engine hash)
//	Removed  = u8 2, u64 worker, u64 event id, u32 n, n × u64 engine hash
//	Query    = u8 3, u32 n, n × u64 local hash, n × u64 sequence hash,
//	           u32 k, k × (u64 worker, u32 expected overlap)
//	Hash     = u8 4, u32 n, n × u32 token, u64 expected digest
//
// Workers are numbered from 1 with data-parallel rank 0. A query's local
// hashes are what Dynamo's RadixTree walks; its sequence hashes (the chained
// hashes a router computes from the same blocks) are what kvroute's Match
// takes. The expected overlaps come from the generator's ground-truth model;
// workers with no overlap are omitted.
//
// A side's answers are written as a digest file:
//
//	digests  = magic "KVPRES01", u32 section count,
//	           per section: u64 n, n × u64 digest (one per Query or Hash
//	           operation, in file order)
const (
	workloadMagic = "KVPEER01"
	digestMagic   = "KVPRES01"
)

// opKind is the kind of one workload operation.
type opKind uint8

const (
	opStored  opKind = 1
	opRemoved opKind = 2
	opQuery   opKind = 3
	opHash    opKind = 4
)

// metric says how a section's time is divided.
type metric uint8

const (
	perOp      metric = 0 // per operation (query, hashing)
	perBlockOp metric = 1 // per block stored, removed or matched
)

// maxCount bounds every count in a workload file, so a corrupt length cannot
// ask for an absurd allocation.
const maxCount = 1 << 28

var errFormat = errors.New("peers: bad workload file")

// block is one stored block: its local (token) hash and the engine's hash.
type block struct {
	Local kvroute.BlockHash
	Ext   kvroute.ExternalHash
}

// score is one worker's overlap with a query.
type score struct {
	Worker uint64
	Blocks uint32
}

// op is one workload operation; which fields are set depends on Kind.
type op struct {
	Kind opKind
	// Stored and Removed.
	Worker    uint64
	EventID   uint64
	HasParent bool
	Parent    kvroute.ExternalHash
	Blocks    []block
	Removed   []kvroute.ExternalHash
	// Query.
	Locals []kvroute.BlockHash
	Seqs   []kvroute.SeqHash
	Want   []score // sorted by worker
	// Hash.
	Tokens     []uint32
	WantDigest uint64
}

// blockOps is the operation's share of a per-block-operation metric.
func (o *op) blockOps() int {
	switch o.Kind {
	case opStored:
		return len(o.Blocks)
	case opRemoved:
		return len(o.Removed)
	case opQuery:
		return len(o.Locals)
	}
	return 1
}

// answers reports whether the operation produces a digest.
func (o *op) answers() bool { return o.Kind == opQuery || o.Kind == opHash }

// section is a run of operations timed (or not) as one.
type section struct {
	Name   string
	Timed  bool
	Metric metric
	Repeat int
	Ops    []op
}

// passes returns how many times the operations run.
func (s *section) passes() int { return max(s.Repeat, 1) }

// workload is one workload file.
type workload struct {
	BlockSize int
	Sections  []section
}

// writeWorkload writes w to path.
func writeWorkload(path string, w *workload) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("peers: %w", err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := encodeWorkload(bw, w); err != nil {
		f.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("peers: %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("peers: %s: %w", path, err)
	}
	return nil
}

// encodeWorkload writes w in the workload format.
func encodeWorkload(bw io.Writer, w *workload) error {
	e := encoder{w: bw}
	e.bytes([]byte(workloadMagic))
	e.u32(uint32(w.BlockSize))
	e.u32(uint32(len(w.Sections)))
	for i := range w.Sections {
		s := &w.Sections[i]
		if s.passes() > 1 && s.hasEvents() {
			return fmt.Errorf("%w: section %s repeats events", errFormat, s.Name)
		}
		e.u16(uint16(len(s.Name)))
		e.bytes([]byte(s.Name))
		var flags uint8
		if s.Timed {
			flags = 1
		}
		e.u8(flags)
		e.u8(uint8(s.Metric))
		e.u32(uint32(s.passes()))
		e.u64(uint64(len(s.Ops)))
		for j := range s.Ops {
			e.op(&s.Ops[j])
		}
	}
	return e.err
}

func (s *section) hasEvents() bool {
	for i := range s.Ops {
		if k := s.Ops[i].Kind; k == opStored || k == opRemoved {
			return true
		}
	}
	return false
}

type encoder struct {
	w   io.Writer
	buf [8]byte
	err error
}

func (e *encoder) bytes(b []byte) {
	if e.err == nil {
		_, e.err = e.w.Write(b)
	}
}
func (e *encoder) u8(v uint8) { e.buf[0] = v; e.bytes(e.buf[:1]) }
func (e *encoder) u16(v uint16) {
	binary.LittleEndian.PutUint16(e.buf[:], v)
	e.bytes(e.buf[:2])
}
func (e *encoder) u32(v uint32) {
	binary.LittleEndian.PutUint32(e.buf[:], v)
	e.bytes(e.buf[:4])
}
func (e *encoder) u64(v uint64) {
	binary.LittleEndian.PutUint64(e.buf[:], v)
	e.bytes(e.buf[:8])
}

func (e *encoder) op(o *op) {
	e.u8(uint8(o.Kind))
	switch o.Kind {
	case opStored:
		e.u64(o.Worker)
		e.u64(o.EventID)
		if o.HasParent {
			e.u8(1)
		} else {
			e.u8(0)
		}
		e.u64(uint64(o.Parent))
		e.u32(uint32(len(o.Blocks)))
		for _, b := range o.Blocks {
			e.u64(uint64(b.Local))
			e.u64(uint64(b.Ext))
		}
	case opRemoved:
		e.u64(o.Worker)
		e.u64(o.EventID)
		e.u32(uint32(len(o.Removed)))
		for _, h := range o.Removed {
			e.u64(uint64(h))
		}
	case opQuery:
		e.u32(uint32(len(o.Locals)))
		for _, h := range o.Locals {
			e.u64(uint64(h))
		}
		for _, h := range o.Seqs {
			e.u64(uint64(h))
		}
		e.u32(uint32(len(o.Want)))
		for _, s := range o.Want {
			e.u64(s.Worker)
			e.u32(s.Blocks)
		}
	case opHash:
		e.u32(uint32(len(o.Tokens)))
		for _, t := range o.Tokens {
			e.u32(t)
		}
		e.u64(o.WantDigest)
	}
}

// readWorkload reads the workload file at path.
func readWorkload(path string) (*workload, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("peers: %w", err)
	}
	w, err := decodeWorkload(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return w, nil
}

// decodeWorkload parses a workload file. Errors wrap errFormat.
func decodeWorkload(b []byte) (*workload, error) {
	d := decoder{b: b}
	if string(d.take(len(workloadMagic))) != workloadMagic {
		return nil, fmt.Errorf("%w: bad magic", errFormat)
	}
	w := &workload{BlockSize: int(d.u32())}
	n := d.count(1)
	for range n {
		if d.err != nil {
			break
		}
		var s section
		s.Name = string(d.take(int(d.u16())))
		flags, m := d.u8(), metric(d.u8())
		if flags > 1 || m > perBlockOp {
			d.fail("section %q: flags %d, metric %d", s.Name, flags, m)
		}
		s.Timed, s.Metric = flags == 1, m
		s.Repeat = int(d.u32())
		nops := d.u64()
		if nops > maxCount || nops > uint64(len(d.b)) {
			d.fail("operation count %d", nops)
			break
		}
		s.Ops = make([]op, 0, nops)
		for range nops {
			o := d.op()
			if d.err != nil {
				break
			}
			s.Ops = append(s.Ops, o)
		}
		if s.Repeat < 1 || s.Repeat > maxCount || (s.Repeat > 1 && s.hasEvents()) {
			d.fail("section %q: repeat %d", s.Name, s.Repeat)
		}
		w.Sections = append(w.Sections, s)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return w, nil
}

type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: byte %d: %s", errFormat, d.off, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail("truncated (need %d bytes, have %d)", n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b, d.off = d.b[n:], d.off+n
	return v
}

func (d *decoder) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}
func (d *decoder) u16() uint16 {
	if v := d.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}
func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}
func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

// count reads a u32 count of elements of size bytes each and checks that
// they fit in the rest of the input.
func (d *decoder) count(size int) int {
	n := int(d.u32())
	if d.err == nil && (n > maxCount || n*size > len(d.b)) {
		d.fail("count %d exceeds the input", n)
		return 0
	}
	return n
}

func (d *decoder) op() op {
	o := op{Kind: opKind(d.u8())}
	switch o.Kind {
	case opStored:
		o.Worker, o.EventID = d.u64(), d.u64()
		switch d.u8() {
		case 0:
		case 1:
			o.HasParent = true
		default:
			d.fail("has-parent flag is neither 0 nor 1")
		}
		o.Parent = kvroute.ExternalHash(d.u64())
		o.Blocks = make([]block, d.count(16))
		for i := range o.Blocks {
			o.Blocks[i] = block{Local: kvroute.BlockHash(d.u64()), Ext: kvroute.ExternalHash(d.u64())}
		}
	case opRemoved:
		o.Worker, o.EventID = d.u64(), d.u64()
		o.Removed = make([]kvroute.ExternalHash, d.count(8))
		for i := range o.Removed {
			o.Removed[i] = kvroute.ExternalHash(d.u64())
		}
	case opQuery:
		n := d.count(16)
		o.Locals = make([]kvroute.BlockHash, n)
		o.Seqs = make([]kvroute.SeqHash, n)
		for i := range o.Locals {
			o.Locals[i] = kvroute.BlockHash(d.u64())
		}
		for i := range o.Seqs {
			o.Seqs[i] = kvroute.SeqHash(d.u64())
		}
		o.Want = make([]score, d.count(12))
		for i := range o.Want {
			o.Want[i] = score{Worker: d.u64(), Blocks: d.u32()}
		}
	case opHash:
		o.Tokens = make([]uint32, d.count(4))
		for i := range o.Tokens {
			o.Tokens[i] = d.u32()
		}
		o.WantDigest = d.u64()
	default:
		d.fail("unknown operation kind %d", o.Kind)
	}
	return o
}

// readDigests reads a digest file written by a side.
func readDigests(path string) ([][]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("peers: %w", err)
	}
	d := decoder{b: b}
	if string(d.take(len(digestMagic))) != digestMagic {
		return nil, fmt.Errorf("%w: %s: bad digest magic", errFormat, path)
	}
	out := make([][]uint64, d.count(8))
	for i := range out {
		n := d.u64()
		if d.err == nil && n > uint64(len(d.b)/8) {
			d.fail("digest count %d", n)
		}
		if d.err != nil {
			break
		}
		out[i] = make([]uint64, n)
		for j := range out[i] {
			out[i][j] = d.u64()
		}
	}
	if d.err != nil {
		return nil, fmt.Errorf("%s: %w", path, d.err)
	}
	return out, nil
}

// mix is splitmix64's finaliser; the Rust side uses the same function.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// golden is the 64-bit golden ratio, SplitMix64's increment.
const golden = 0x9e3779b97f4a7c15

// scoreTerm is one worker's term of a query digest.
func scoreTerm(worker uint64, blocks uint32) uint64 {
	return mix(worker*golden ^ uint64(blocks))
}

// scoresDigest is the order-independent digest of a query's overlaps: the
// wrapping sum of scoreTerm over the workers with a non-zero overlap.
func scoresDigest(s []score) uint64 {
	var d uint64
	for _, x := range s {
		if x.Blocks > 0 {
			d += scoreTerm(x.Worker, x.Blocks)
		}
	}
	return d
}

// seqDigest is the digest of one chained hashing: mix of the last sequence
// hash plus the number of hashes.
func seqDigest(seqs []kvroute.SeqHash) uint64 {
	if len(seqs) == 0 {
		return 0
	}
	return mix(uint64(seqs[len(seqs)-1])) + uint64(len(seqs))
}

// expectedDigests returns, per section, the digest of every answering
// operation's expected result.
func expectedDigests(w *workload) [][]uint64 {
	out := make([][]uint64, len(w.Sections))
	for i := range w.Sections {
		for j := range w.Sections[i].Ops {
			o := &w.Sections[i].Ops[j]
			switch o.Kind {
			case opQuery:
				out[i] = append(out[i], scoresDigest(o.Want))
			case opHash:
				out[i] = append(out[i], o.WantDigest)
			}
		}
	}
	return out
}
