package natsx_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// dropFunc decides whether the proxy drops a message on subject; toClient
// tells the direction (server to client: MSG/HMSG; client to server:
// PUB/HPUB). The payload it sees is the message's data, without headers.
type dropFunc func(subject string, payload []byte, toClient bool) bool

// natsProxy is a loopback TCP proxy in front of a NATS server that
// understands the protocol's framing, so that it can drop whole messages
// (a lossy network for core NATS, which delivers at most once). Closing
// the upstream server closes the client side too, and clients reconnect
// through the proxy.
type natsProxy struct {
	ln       net.Listener
	upstream string
	drop     atomic.Pointer[dropFunc]
	dropped  atomic.Uint64
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
}

func startProxy(t testing.TB, upstream string) *natsProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &natsProxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// URL is the address clients connect to.
func (p *natsProxy) URL() string { return "nats://" + p.ln.Addr().String() }

// setDrop installs f (nil: drop nothing).
func (p *natsProxy) setDrop(f dropFunc) {
	if f == nil {
		p.drop.Store(nil)
		return
	}
	p.drop.Store(&f)
}

func (p *natsProxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !add {
		delete(p.conns, c)
		return true
	}
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *natsProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close() // the server is down: the client retries
			continue
		}
		if !p.track(c, true) || !p.track(u, true) {
			_ = c.Close()
			_ = u.Close()
			return
		}
		p.wg.Go(func() { p.pipe(u, c, true) })
		p.wg.Go(func() { p.pipe(c, u, false) })
	}
}

// pipe copies NATS protocol from src to dst, leaving out the messages the
// drop function picks; it closes both ends when either fails.
func (p *natsProxy) pipe(src, dst net.Conn, toClient bool) {
	defer func() {
		_ = src.Close()
		_ = dst.Close()
		p.track(src, false)
		p.track(dst, false)
	}()
	r := bufio.NewReaderSize(src, 64<<10)
	w := bufio.NewWriterSize(dst, 64<<10)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return
		}
		line = append([]byte(nil), line...)
		fields := bytes.Fields(line)
		var payload []byte
		subject, headers := "", 0
		if len(fields) >= 3 {
			switch op := string(bytes.ToUpper(fields[0])); op {
			case "MSG", "HMSG", "PUB", "HPUB":
				n, err := strconv.Atoi(string(fields[len(fields)-1]))
				if err != nil || n < 0 {
					return
				}
				if op[0] == 'H' { // the payload starts with the headers' bytes
					if headers, err = strconv.Atoi(string(fields[len(fields)-2])); err != nil || headers < 0 || headers > n {
						return
					}
				}
				payload = make([]byte, n+2)
				if _, err := io.ReadFull(r, payload); err != nil {
					return
				}
				subject = string(fields[1])
			}
		}
		if payload != nil {
			if f := p.drop.Load(); f != nil && (*f)(subject, payload[headers:len(payload)-2], toClient) {
				p.dropped.Add(1)
				continue
			}
		}
		if _, err := w.Write(line); err != nil {
			return
		}
		if _, err := w.Write(payload); err != nil {
			return
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

func (p *natsProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
