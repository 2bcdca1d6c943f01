// Package quickack keeps a client's TCP connections from delaying their
// acknowledgements, so that a server which leaves Nagle's algorithm on
// cannot hold back the first chunk of a streamed answer.
//
// A server with Nagle's algorithm on (no TCP_NODELAY) sends a small
// segment only when every segment before it has been acknowledged. When
// it writes a response's headers and, a moment later, its first streamed
// chunk, the chunk waits for the client's acknowledgement of the headers.
// On a reused connection Linux delays that acknowledgement by up to 40 ms,
// so every answer faster than that arrives about 40 ms after the request,
// whatever the server's real latency. NVIDIA Dynamo 1.6.1's HTTP frontend
// is such a server: a streamed chat whose prompt it has cached starts in
// 19 ms on a new connection and in 42–46 ms on a kept-alive one. A new
// connection is spared only because Linux acknowledges at once while a
// connection is young.
//
// Wrap and DialContext re-arm TCP_QUICKACK after every read, which makes
// Linux acknowledge what the connection receives at once. That costs one
// setsockopt call per read. On other systems they change nothing.
package quickack

import (
	"context"
	"net"
)

// DialContext returns a dial function for http.Transport.DialContext (or
// any other user of one) whose TCP connections acknowledge at once: d's
// connections wrapped by Wrap. A nil d means a zero net.Dialer.
func DialContext(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if d == nil {
		d = &net.Dialer{}
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return Wrap(c), nil
	}
}
