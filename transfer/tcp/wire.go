package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/kvroute/kvroute/transfer"
)

// Wire format. All integers are little-endian.
//
// Metadata (Agent.LocalMetadata):
//
//	"KVRT" version:u8 nameLen:u16 name addrLen:u16 addr incarnation:u64
//	count:u32 count × (kind:u8 addr:u64 len:u64 dev:u64)
//
// The incarnation is drawn at random when the agent starts. A connection
// starts with the initiator's hello, naming the target and the incarnation
// its metadata gave, answered by one status byte (and, when it is not
// statusOK, a message):
//
//	"KVRX" version:u8 fromLen:u16 from toLen:u16 to incarnation:u64
//
// then carries request frames from the initiator,
//
//	kind:u8 id:u64 count:u32 hasNotif:u8 notifLen:u32 dataLen:u64
//	count × (addr:u64 len:u64 dev:u64) notif [data, for kindWrite]
//
// and response frames from the target,
//
//	id:u64 status:u8 msgLen:u16 dataLen:u64 msg [data, for a good read]
const (
	wireVersion  = 2
	mdMagic      = "KVRT"
	helloMagic   = "KVRX"
	reqHeaderLen = 1 + 8 + 4 + 1 + 4 + 8
	respHeadLen  = 8 + 1 + 2 + 8
	descWireLen  = 24
	regionLen    = 1 + 24
	// maxFrameDescs bounds the descriptors of one request frame (24 MiB of
	// descriptors), so a corrupt count cannot make the reader allocate much.
	maxFrameDescs = 1 << 20
	// maxNotifLen bounds a notification message.
	maxNotifLen = 1 << 20
	// maxNameLen bounds agent names and addresses.
	maxNameLen = 1 << 12
	// maxRegions bounds the regions in metadata.
	maxRegions = 1 << 20
)

// Request kinds.
const (
	kindWrite uint8 = iota + 1
	kindRead
	kindNotif
)

// Response statuses.
const (
	statusOK uint8 = iota
	statusNotRegistered
	statusInvalid
	statusUnknownAgent
	// statusStale refuses a hello carrying another incarnation: the
	// target restarted since the initiator loaded its metadata.
	statusStale
)

// statusErr maps a response status to the sentinel it stands for.
func statusErr(s uint8) error {
	switch s {
	case statusNotRegistered:
		return transfer.ErrNotRegistered
	case statusInvalid:
		return transfer.ErrInvalidParam
	case statusUnknownAgent:
		return transfer.ErrUnknownAgent
	case statusStale:
		return transfer.ErrRemoteDisconnect
	}
	return transfer.ErrBackend
}

// region is a registered range of memory.
type region struct {
	kind transfer.MemKind
	desc transfer.Desc
}

// metadata is the decoded form of an agent's metadata.
type metadata struct {
	name string
	addr string
	// incarnation tells a restarted agent from the one the metadata
	// describes, at the same name and address.
	incarnation uint64
	regions     []region
	// index finds the region holding a descriptor; unmarshalMetadata
	// builds it, and regions is its sorted regions then.
	index regionIndex[struct{}]
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func (m *metadata) marshal() []byte {
	b := make([]byte, 0, 4+1+4+len(m.name)+len(m.addr)+8+4+len(m.regions)*regionLen)
	b = append(b, mdMagic...)
	b = append(b, wireVersion)
	b = appendString(b, m.name)
	b = appendString(b, m.addr)
	b = binary.LittleEndian.AppendUint64(b, m.incarnation)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.regions)))
	for _, r := range m.regions {
		b = append(b, byte(r.kind))
		b = appendDesc(b, r.desc)
	}
	return b
}

func appendDesc(b []byte, d transfer.Desc) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(d.Addr))
	b = binary.LittleEndian.AppendUint64(b, d.Len)
	return binary.LittleEndian.AppendUint64(b, d.DevID)
}

func decodeDesc(b []byte) transfer.Desc {
	return transfer.Desc{
		Addr:  uintptr(binary.LittleEndian.Uint64(b)),
		Len:   binary.LittleEndian.Uint64(b[8:]),
		DevID: binary.LittleEndian.Uint64(b[16:]),
	}
}

// reader consumes a byte slice, remembering the first short read.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) take(n int) []byte {
	if r.bad || n < 0 || n > len(r.b) {
		r.bad = true
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u8() uint8 {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (r *reader) str() string { return string(r.take(int(r.u16()))) }

func unmarshalMetadata(b []byte) (*metadata, error) {
	r := &reader{b: b}
	if string(r.take(4)) != mdMagic {
		return nil, fmt.Errorf("%w: not TCP agent metadata", transfer.ErrBadMetadata)
	}
	if v := r.u8(); v != wireVersion {
		return nil, fmt.Errorf("%w: metadata version %d, want %d", transfer.ErrBadMetadata, v, wireVersion)
	}
	m := &metadata{name: r.str(), addr: r.str(), incarnation: r.u64()}
	n := r.u32()
	if r.bad || n > maxRegions || int(n)*regionLen != len(r.b) {
		return nil, fmt.Errorf("%w: truncated or oversized metadata", transfer.ErrBadMetadata)
	}
	if m.name == "" || m.addr == "" {
		return nil, fmt.Errorf("%w: metadata without name or address", transfer.ErrBadMetadata)
	}
	if len(m.name) > maxNameLen {
		// No agent has such a name, and a hello could not carry it.
		return nil, fmt.Errorf("%w: agent name of %d bytes (max %d)", transfer.ErrBadMetadata, len(m.name), maxNameLen)
	}
	m.regions = make([]region, n)
	for i := range m.regions {
		kind := transfer.MemKind(r.u8())
		d := decodeDesc(r.take(descWireLen))
		if !kind.Valid() {
			return nil, fmt.Errorf("%w: region of memory kind %d", transfer.ErrBadMetadata, kind)
		}
		if _, ok := d.End(); !ok {
			return nil, fmt.Errorf("%w: region at %#x wraps", transfer.ErrBadMetadata, d.Addr)
		}
		m.regions[i] = region{kind: kind, desc: d}
	}
	m.index.add(m.regions, make([]struct{}, n))
	m.regions = m.index.regs
	return m, nil
}

// hello is the first message of a connection: who calls, and which agent
// (name and incarnation) it means to reach.
type hello struct {
	from, to    string
	incarnation uint64
}

func (h hello) marshal() []byte {
	b := append([]byte(helloMagic), wireVersion)
	b = appendString(b, h.from)
	b = appendString(b, h.to)
	return binary.LittleEndian.AppendUint64(b, h.incarnation)
}

// readString reads a u16-length-prefixed string of at most maxNameLen bytes.
func readString(rd io.Reader) (string, error) {
	var n [2]byte
	if _, err := io.ReadFull(rd, n[:]); err != nil {
		return "", err
	}
	l := binary.LittleEndian.Uint16(n[:])
	if l > maxNameLen {
		return "", fmt.Errorf("%w: name of %d bytes", transfer.ErrInvalidParam, l)
	}
	b := make([]byte, l)
	if _, err := io.ReadFull(rd, b); err != nil {
		return "", err
	}
	return string(b), nil
}

func readHello(rd io.Reader) (hello, error) {
	var head [5]byte
	if _, err := io.ReadFull(rd, head[:]); err != nil {
		return hello{}, err
	}
	if string(head[:4]) != helloMagic || head[4] != wireVersion {
		return hello{}, errors.New("tcp: not a kvroute transfer connection or wrong version")
	}
	from, err := readString(rd)
	if err != nil {
		return hello{}, err
	}
	to, err := readString(rd)
	if err != nil {
		return hello{}, err
	}
	var inc [8]byte
	if _, err := io.ReadFull(rd, inc[:]); err != nil {
		return hello{}, err
	}
	return hello{from: from, to: to, incarnation: binary.LittleEndian.Uint64(inc[:])}, nil
}

// reqHeader is the fixed part of a request frame.
type reqHeader struct {
	kind     uint8
	id       uint64
	count    uint32
	hasNotif bool
	notifLen uint32
	dataLen  uint64
}

func (h *reqHeader) append(b []byte) []byte {
	b = append(b, h.kind)
	b = binary.LittleEndian.AppendUint64(b, h.id)
	b = binary.LittleEndian.AppendUint32(b, h.count)
	n := uint8(0)
	if h.hasNotif {
		n = 1
	}
	b = append(b, n)
	b = binary.LittleEndian.AppendUint32(b, h.notifLen)
	return binary.LittleEndian.AppendUint64(b, h.dataLen)
}

func parseReqHeader(b []byte) (reqHeader, error) {
	h := reqHeader{
		kind:     b[0],
		id:       binary.LittleEndian.Uint64(b[1:]),
		count:    binary.LittleEndian.Uint32(b[9:]),
		hasNotif: b[13] != 0,
		notifLen: binary.LittleEndian.Uint32(b[14:]),
		dataLen:  binary.LittleEndian.Uint64(b[18:]),
	}
	switch {
	case h.kind < kindWrite || h.kind > kindNotif:
		return h, fmt.Errorf("unknown request kind %d", h.kind)
	case h.count > maxFrameDescs:
		return h, fmt.Errorf("%d descriptors in one frame", h.count)
	case h.notifLen > maxNotifLen:
		return h, fmt.Errorf("notification of %d bytes", h.notifLen)
	case h.kind == kindNotif && (h.count != 0 || h.dataLen != 0):
		return h, errors.New("notification frame with descriptors")
	}
	return h, nil
}

// respHeader is the fixed part of a response frame.
type respHeader struct {
	id      uint64
	status  uint8
	msgLen  uint16
	dataLen uint64
}

func (h *respHeader) append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, h.id)
	b = append(b, h.status)
	b = binary.LittleEndian.AppendUint16(b, h.msgLen)
	return binary.LittleEndian.AppendUint64(b, h.dataLen)
}

func parseRespHeader(b []byte) respHeader {
	return respHeader{
		id:      binary.LittleEndian.Uint64(b),
		status:  b[8],
		msgLen:  binary.LittleEndian.Uint16(b[9:]),
		dataLen: binary.LittleEndian.Uint64(b[11:]),
	}
}

// totalLen sums descriptor lengths, failing on overflow.
func totalLen(ds []transfer.Desc) (uint64, bool) {
	var n uint64
	for _, d := range ds {
		if n+d.Len < n {
			return 0, false
		}
		n += d.Len
	}
	return n, true
}
