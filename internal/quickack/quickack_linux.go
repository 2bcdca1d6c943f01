package quickack

import (
	"io"
	"net"
	"syscall"
)

// conn is a TCP connection that re-arms TCP_QUICKACK after every read.
type conn struct {
	*net.TCPConn
	raw syscall.RawConn
}

// Wrap returns c re-arming TCP_QUICKACK after every read when c is a TCP
// connection (*net.TCPConn), and c itself otherwise. The wrapper is
// used as c: closing it closes c.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	arm(raw)
	return &conn{TCPConn: tc, raw: raw}
}

// Read reads from the connection, then asks the kernel to acknowledge at
// once, including what it has received and not yet acknowledged.
func (c *conn) Read(p []byte) (int, error) {
	n, err := c.TCPConn.Read(p)
	arm(c.raw)
	return n, err
}

// WriteTo copies the connection to w through Read, so that the copy
// acknowledges at once too (net.TCPConn's own WriteTo would read around
// it).
func (c *conn) WriteTo(w io.Writer) (int64, error) {
	return io.Copy(w, struct{ io.Reader }{c})
}

// Armed reports whether c, a connection with a SyscallConn method such as
// *net.TCPConn or one that Wrap returned, would acknowledge what it
// receives at once: whether Linux's TCP_QUICKACK reads 1, which it does
// while the connection is out of delayed-acknowledgement mode.
func Armed(c syscall.Conn) (bool, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return false, err
	}
	var v int
	var serr error
	if err := raw.Control(func(fd uintptr) {
		v, serr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK)
	}); err != nil {
		return false, err
	}
	return v == 1, serr
}

// arm sets TCP_QUICKACK. A failure (the connection closed) only means
// there is nothing left to acknowledge.
func arm(raw syscall.RawConn) {
	_ = raw.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 1)
	})
}
