package tcp

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"time"

	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/internal/rawmem"
)

// accept serves incoming connections until the listener closes.
func (a *Agent) accept() {
	defer a.wg.Done()
	for {
		conn, err := a.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				a.log.Warn("accept failed, no longer serving", "err", err)
			}
			return
		}
		a.mu.Lock()
		if a.closed {
			a.mu.Unlock()
			_ = conn.Close()
			return
		}
		a.served[conn] = struct{}{}
		a.wg.Add(1)
		a.mu.Unlock()
		go a.serve(conn)
	}
}

// serve answers one initiator's requests in order until it disconnects.
func (a *Agent) serve(conn net.Conn) {
	defer a.wg.Done()
	defer func() {
		a.mu.Lock()
		delete(a.served, conn)
		a.mu.Unlock()
		_ = conn.Close()
	}()
	_ = conn.SetDeadline(time.Now().Add(a.cfg.IOTimeout))
	h, err := readHello(conn)
	if err != nil {
		a.log.Debug("bad hello", "remote", conn.RemoteAddr(), "err", err)
		return
	}
	if h.to != a.cfg.Name || h.from == "" {
		b := appendString([]byte{statusUnknownAgent}, fmt.Sprintf("agent %q is not here (this is %q)", h.to, a.cfg.Name))
		_, _ = conn.Write(b)
		return
	}
	if h.incarnation != a.incarnation {
		// The initiator's metadata describes an agent of this name that
		// is gone: its memory is not this agent's, whatever the addresses.
		b := appendString([]byte{statusStale}, fmt.Sprintf("agent %q restarted since its metadata was taken; load it again", a.cfg.Name))
		_, _ = conn.Write(b)
		return
	}
	if _, err := conn.Write([]byte{statusOK}); err != nil {
		return
	}
	s := server{agent: a, conn: conn, body: &progress{conn: conn, timeout: a.cfg.IOTimeout}, from: h.from}
	if err := s.loop(); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		a.log.Debug("connection closed", "from", h.from, "err", err)
	}
}

// server is the target side of one connection.
type server struct {
	agent *Agent
	conn  net.Conn
	// body reads and writes the frames after their headers.
	body  *progress
	from  string
	descs []transfer.Desc
	buf   []byte
}

func (s *server) loop() error {
	var head [reqHeaderLen]byte
	for {
		// The wait for the next frame is unbounded; once its first byte
		// arrived, the rest of it must keep moving.
		_ = s.conn.SetDeadline(time.Time{})
		if err := readHeader(s.conn, s.body, head[:]); err != nil {
			return err
		}
		h, err := parseReqHeader(head[:])
		if err != nil {
			return err
		}
		if err := s.readDescs(h); err != nil {
			return err
		}
		notif, err := readBytes(s.body, int(h.notifLen))
		if err != nil {
			return err
		}
		switch h.kind {
		case kindNotif:
			s.agent.deliver(s.from, notif)
		case kindWrite:
			err = s.write(h, notif)
		case kindRead:
			err = s.read(h)
		}
		if err != nil {
			return err
		}
	}
}

// descBatch is how many descriptors readDescs reads at a time (96 KiB), so
// that the memory a frame's descriptors take grows with the bytes that
// arrived rather than with the count its header announces.
const descBatch = 4096

// readBytes reads n bytes into a buffer that grows as they arrive, from
// 64 KiB, so that a header announcing n bytes costs no more than what
// followed it.
func readBytes(r io.Reader, n int) ([]byte, error) {
	b := make([]byte, 0, min(n, 64<<10))
	for len(b) < n {
		if len(b) == cap(b) {
			b = slices.Grow(b, min(n-len(b), cap(b)))
		}
		k, err := io.ReadFull(r, b[len(b):min(n, cap(b))])
		b = b[:len(b)+k]
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

// readDescs reads the frame's descriptors into s.descs.
func (s *server) readDescs(h reqHeader) error {
	s.descs = s.descs[:0]
	for left := int(h.count); left > 0; {
		k := min(left, descBatch)
		n := k * descWireLen
		if cap(s.buf) < n {
			s.buf = make([]byte, n)
		}
		b := s.buf[:n]
		if _, err := io.ReadFull(s.body, b); err != nil {
			return err
		}
		for i := 0; i < n; i += descWireLen {
			s.descs = append(s.descs, decodeDesc(b[i:]))
		}
		left -= k
	}
	return nil
}

// pin pins the registered regions holding the frame's descriptors. When
// one lies outside registered memory it pins nothing and returns the status
// and message to answer with.
func (s *server) pin() (pins, uint8, string) {
	p, i := s.agent.regs.pin(transfer.DRAM, s.descs)
	if i >= 0 {
		d := s.descs[i]
		return pins{}, statusNotRegistered, fmt.Sprintf("descriptor %d: %#x+%d dev %d", i, d.Addr, d.Len, d.DevID)
	}
	return p, statusOK, ""
}

// write lands a WRITE's data in registered memory, then delivers its
// notification, then acknowledges it.
func (s *server) write(h reqHeader, notif []byte) error {
	total, ok := totalLen(s.descs)
	if !ok || total != h.dataLen || total > math.MaxInt64 {
		return fmt.Errorf("write of %d bytes for descriptors of %d", h.dataLen, total)
	}
	p, st, msg := s.pin()
	if st != statusOK {
		if _, err := io.CopyN(io.Discard, s.body, int64(h.dataLen)); err != nil {
			return err
		}
		return s.respond(h.id, st, msg, nil)
	}
	err := s.land()
	s.agent.regs.unpin(p)
	if err != nil {
		return err
	}
	if h.hasNotif {
		s.agent.deliver(s.from, notif)
	}
	return s.respond(h.id, statusOK, "", nil)
}

// land reads a WRITE's data into the frame's descriptors.
func (s *server) land() error {
	for _, d := range s.descs {
		if _, err := io.ReadFull(s.body, rawmem.Bytes(d.Addr, d.Len)); err != nil {
			return err
		}
	}
	return nil
}

// read sends a READ's data from registered memory.
func (s *server) read(h reqHeader) error {
	if h.dataLen != 0 {
		return fmt.Errorf("read request carrying %d bytes", h.dataLen)
	}
	if _, ok := totalLen(s.descs); !ok {
		return s.respond(h.id, statusInvalid, "descriptor lengths overflow", nil)
	}
	p, st, msg := s.pin()
	if st != statusOK {
		return s.respond(h.id, st, msg, nil)
	}
	defer s.agent.regs.unpin(p)
	data := make(net.Buffers, 0, len(s.descs))
	for _, d := range s.descs {
		data = append(data, rawmem.Bytes(d.Addr, d.Len))
	}
	return s.respond(h.id, statusOK, "", data)
}

func (s *server) respond(id uint64, st uint8, msg string, data net.Buffers) error {
	if len(msg) > 1<<15 {
		msg = msg[:1<<15]
	}
	var n uint64
	for _, b := range data {
		n += uint64(len(b))
	}
	h := respHeader{id: id, status: st, msgLen: uint16(len(msg)), dataLen: n}
	head := append(h.append(make([]byte, 0, respHeadLen+len(msg))), msg...)
	return s.body.writeBuffers(append(net.Buffers{head}, data...))
}
