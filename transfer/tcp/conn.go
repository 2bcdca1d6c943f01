package tcp

import (
	"context"
	"io"
	"math"
	"net"
	"sync"
	"time"

	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/internal/rawmem"
)

// frame is one queued message of a connection.
type frame struct {
	kind     uint8
	id       uint64
	req      *request // nil for notification frames
	notif    []byte
	hasNotif bool
	// onSent, when set, is called once the frame was written or failed.
	onSent func(error)
}

// peerConn is an initiator's connection to one remote agent. A sender
// goroutine dials, then writes queued frames in order; a receiver goroutine
// reads the responses. Any error kills the connection and fails every
// request on it; the next Post to the agent dials again.
type peerConn struct {
	agent  *Agent
	remote string
	addr   string
	// incarnation is the remote's, from the metadata the connection was
	// started with; the hello names it.
	incarnation uint64
	wake        chan struct{} // signals the sender that the queue is not empty
	dead        chan struct{} // closed by fail

	mu sync.Mutex // protects the fields below
	// queue holds frames not yet written, in order.
	queue []*frame
	// pending maps the id of each posted request to its frame until the
	// response arrives.
	pending map[uint64]*frame
	// err is why the connection died; nil while it is alive.
	err  error
	conn net.Conn // nil until dialled
}

// startConn starts a connection to the remote agent md describes. The
// caller holds a.mu.
func (a *Agent) startConn(name string, md *metadata) *peerConn {
	c := &peerConn{
		agent:       a,
		remote:      name,
		addr:        md.addr,
		incarnation: md.incarnation,
		wake:        make(chan struct{}, 1),
		dead:        make(chan struct{}),
		pending:     make(map[uint64]*frame),
	}
	a.wg.Add(1)
	go c.run()
	return c
}

func (c *peerConn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// enqueue appends a frame. On a dead connection it returns why it died and
// queues nothing.
func (c *peerConn) enqueue(f *frame) error {
	c.mu.Lock()
	if err := c.err; err != nil {
		c.mu.Unlock()
		return err
	}
	c.queue = append(c.queue, f)
	if f.req != nil {
		c.pending[f.id] = f
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return nil
}

// forget drops a canceled request's entry, so its response is discarded.
func (c *peerConn) forget(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, id)
}

// take removes and returns the pending frame with id.
func (c *peerConn) take(id uint64) *frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.pending[id]
	delete(c.pending, id)
	return f
}

// failFrame finishes an unsent frame with err: its request fails, and a
// standalone notification is dropped with a log line.
func (c *peerConn) failFrame(f *frame, err error) {
	if f.req == nil && f.onSent == nil {
		c.agent.log.Warn("notification not sent", "remote", c.remote, "err", err)
	}
	if f.req != nil {
		f.req.complete(f.id, err)
	}
	if f.onSent != nil {
		f.onSent(err)
	}
}

// fail kills the connection and fails its queued and pending requests.
func (c *peerConn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.dead)
	conn := c.conn
	frames := c.queue
	c.queue = nil
	for id, f := range c.pending {
		if f.onSent == nil {
			frames = append(frames, f)
		}
		delete(c.pending, id)
	}
	c.mu.Unlock()
	if conn != nil {
		_ = conn.Close()
	}
	seen := make(map[*frame]bool, len(frames))
	for _, f := range frames {
		if !seen[f] {
			seen[f] = true
			c.failFrame(f, err)
		}
	}
}

// disconnected wraps a network error as ErrRemoteDisconnect.
func (c *peerConn) disconnected(stage string, err error) error {
	return c.agent.errorf("transfer", c.remote, transfer.ErrRemoteDisconnect, "%s %s: %v", stage, c.addr, err)
}

// run dials, says hello, starts the receiver and writes frames until the
// connection dies.
func (c *peerConn) run() {
	a := c.agent
	defer a.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.DialTimeout)
	go func() {
		select {
		case <-c.dead:
			cancel()
		case <-ctx.Done():
		}
	}()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", c.addr)
	cancel()
	if err != nil {
		c.fail(c.disconnected("dial", err))
		return
	}
	c.mu.Lock()
	c.conn = conn
	dead := c.err != nil
	c.mu.Unlock()
	if dead {
		_ = conn.Close()
		return
	}
	if err := c.handshake(conn); err != nil {
		c.fail(err)
		return
	}
	a.wg.Add(1)
	go c.receive(conn)
	out := &progress{conn: conn, timeout: a.cfg.IOTimeout}
	var buf []byte
	for {
		select {
		case <-c.dead:
			return
		case <-c.wake:
		}
		c.mu.Lock()
		frames := c.queue
		c.queue = nil
		c.mu.Unlock()
		for i, f := range frames {
			var err error
			buf, err = c.write(out, f, buf[:0])
			if f.onSent != nil {
				f.onSent(err)
			}
			if err != nil {
				// The rest of the batch is neither queued nor
				// pending any more: fail it here, or a READ waiting
				// for its notification to go out never finishes.
				err = c.disconnected("write to", err)
				c.fail(err)
				for _, rest := range frames[i+1:] {
					c.failFrame(rest, err)
				}
				return
			}
		}
	}
}

func (c *peerConn) handshake(conn net.Conn) error {
	a := c.agent
	_ = conn.SetDeadline(time.Now().Add(a.cfg.IOTimeout))
	defer func() { _ = conn.SetDeadline(time.Time{}) }()
	if _, err := conn.Write(hello{from: a.cfg.Name, to: c.remote, incarnation: c.incarnation}.marshal()); err != nil {
		return c.disconnected("hello to", err)
	}
	var st [1]byte
	if _, err := io.ReadFull(conn, st[:]); err != nil {
		return c.disconnected("hello from", err)
	}
	if st[0] != statusOK {
		msg, _ := readString(conn)
		return a.errorf("connect", c.remote, statusErr(st[0]), "%s refused: %s", c.addr, msg)
	}
	return nil
}

// write sends one frame. A write request whose posting was canceled is
// skipped; one whose local memory is no longer registered fails alone.
func (c *peerConn) write(out *progress, f *frame, buf []byte) ([]byte, error) {
	h := reqHeader{kind: f.kind, id: f.id, hasNotif: f.hasNotif, notifLen: uint32(len(f.notif))}
	var r *request
	if f.req != nil {
		r = f.req
		h.count = uint32(len(r.rdescs))
		if f.kind == kindWrite {
			h.dataLen, _ = totalLen(r.local)
			// Hold the request's copy lock and pin the local regions
			// while local memory is read, so neither Release nor
			// DeregisterMem returns while bytes are still being sent.
			r.copyMu.Lock()
			defer r.copyMu.Unlock()
			r.mu.Lock()
			live := r.active(f.id)
			r.mu.Unlock()
			if !live {
				return buf, nil
			}
			p, i := c.agent.regs.pin(transfer.DRAM, r.local)
			if i >= 0 {
				c.take(f.id)
				r.complete(f.id, c.agent.errorf("post", c.remote, transfer.ErrNotRegistered, "local descriptor %d was deregistered", i))
				return buf, nil
			}
			defer c.agent.regs.unpin(p)
		}
	}
	buf = h.append(buf)
	if r != nil {
		for _, d := range r.rdescs {
			buf = appendDesc(buf, d)
		}
	}
	buf = append(buf, f.notif...)
	bufs := net.Buffers{buf}
	if f.kind == kindWrite {
		for _, d := range r.local {
			bufs = append(bufs, rawmem.Bytes(d.Addr, d.Len))
		}
	}
	return buf, out.writeBuffers(bufs)
}

// receive reads responses until the connection dies.
func (c *peerConn) receive(conn net.Conn) {
	defer c.agent.wg.Done()
	var head [respHeadLen]byte
	// The wait for the next response is unbounded; once its first byte
	// arrived, the rest of it must keep moving.
	rd := &progress{conn: conn, timeout: c.agent.cfg.IOTimeout}
	for {
		_ = conn.SetReadDeadline(time.Time{})
		if err := readHeader(conn, rd, head[:]); err != nil {
			c.fail(c.disconnected("read from", err))
			return
		}
		h := parseRespHeader(head[:])
		msg := make([]byte, h.msgLen)
		if _, err := io.ReadFull(rd, msg); err != nil {
			c.fail(c.disconnected("read from", err))
			return
		}
		if err := c.response(rd, h, string(msg)); err != nil {
			c.fail(err)
			return
		}
	}
}

// response handles one response whose header and message were read; rd
// reads the rest of it.
func (c *peerConn) response(rd io.Reader, h respHeader, msg string) error {
	if h.dataLen > math.MaxInt64 {
		return c.agent.errorf("transfer", c.remote, transfer.ErrBackend, "protocol error: response of %d bytes", h.dataLen)
	}
	f := c.take(h.id)
	if f == nil || f.req == nil {
		// Canceled: drop its data.
		if _, err := io.CopyN(io.Discard, rd, int64(h.dataLen)); err != nil {
			return c.disconnected("read from", err)
		}
		return nil
	}
	r := f.req
	if h.status != statusOK {
		if h.dataLen != 0 {
			// The request was taken off the connection: complete it here,
			// failing the connection does not reach it any more.
			err := c.agent.errorf("transfer", c.remote, transfer.ErrBackend, "protocol error: error response with data")
			r.complete(f.id, err)
			return err
		}
		r.complete(f.id, c.agent.errorf("transfer", c.remote, statusErr(h.status), "peer: %s", msg))
		return nil
	}
	want := uint64(0)
	if f.kind == kindRead {
		want, _ = totalLen(r.local)
	}
	if h.dataLen != want {
		err := c.agent.errorf("transfer", c.remote, transfer.ErrBackend, "protocol error: %d response bytes, want %d", h.dataLen, want)
		r.complete(f.id, err)
		return err
	}
	if f.kind == kindWrite {
		r.complete(f.id, nil)
		return nil
	}
	landed, err := c.readInto(rd, f, h.dataLen)
	if err != nil {
		r.complete(f.id, err)
		return err
	}
	if !landed || !r.hasNotif {
		if landed {
			r.complete(f.id, nil)
		}
		return nil
	}
	// The data landed: tell the target, and report done once the
	// notification is on the wire.
	id := f.id
	onSent := func(err error) {
		if err != nil {
			err = c.agent.errorf("transfer", c.remote, transfer.ErrRemoteDisconnect, "notification not sent: %v", err)
		}
		r.complete(id, err)
	}
	if err := c.enqueue(&frame{kind: kindNotif, notif: r.notif, hasNotif: true, onSent: onSent}); err != nil {
		onSent(err)
	}
	return nil
}

// readInto copies a read response into the request's local memory and
// reports whether it landed; the data of a request canceled or deregistered
// meanwhile is discarded. A returned error is fatal for the connection.
func (c *peerConn) readInto(rd io.Reader, f *frame, n uint64) (bool, error) {
	r := f.req
	r.copyMu.Lock()
	defer r.copyMu.Unlock()
	r.mu.Lock()
	live := r.active(f.id)
	r.mu.Unlock()
	if !live {
		_, err := io.CopyN(io.Discard, rd, int64(n))
		return false, c.wrapRead(err)
	}
	p, i := c.agent.regs.pin(transfer.DRAM, r.local)
	if i >= 0 {
		r.complete(f.id, c.agent.errorf("transfer", c.remote, transfer.ErrNotRegistered, "local descriptor %d was deregistered", i))
		_, err := io.CopyN(io.Discard, rd, int64(n))
		return false, c.wrapRead(err)
	}
	defer c.agent.regs.unpin(p)
	for _, d := range r.local {
		if _, err := io.ReadFull(rd, rawmem.Bytes(d.Addr, d.Len)); err != nil {
			return false, c.wrapRead(err)
		}
	}
	return true, nil
}

func (c *peerConn) wrapRead(err error) error {
	if err == nil {
		return nil
	}
	return c.disconnected("read from", err)
}
