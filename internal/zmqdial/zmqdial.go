// Package zmqdial connects ZMQ sockets without waiting forever on a peer
// that accepts TCP connections but never speaks ZMTP: a frozen engine
// process whose kernel still accepts connections, or an endpoint that is
// some other service. The socket library's dial bounds the TCP connect
// only; its handshake has no deadline and does not watch a context.
package zmqdial

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
)

// ErrNoGreeting is returned when the peer did not complete a ZMTP
// handshake in time.
var ErrNoGreeting = errors.New("zmqdial: the peer did not complete a ZMTP handshake")

// Dial connects sock to endpoint. For a tcp:// endpoint it first checks,
// on a connection of its own, that the peer completes a ZMTP handshake
// within timeout: a peer that does not is an error wrapping
// ErrNoGreeting, and the socket never waits on it. The
// socket's own dial then runs until it ends, ctx ends or timeout passes,
// whichever is first; after the last two the caller should close the
// socket. timeout must be positive.
func Dial(ctx context.Context, sock zmq4.Socket, endpoint string, timeout time.Duration) error {
	if timeout <= 0 {
		return fmt.Errorf("zmqdial: timeout %v", timeout)
	}
	if addr, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		if err := greets(ctx, addr, sock.Type(), timeout); err != nil {
			return fmt.Errorf("zmqdial: %s: %w", endpoint, err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- sock.Dial(endpoint) }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return fmt.Errorf("zmqdial: %s: no ZMTP handshake within %v", endpoint, timeout)
	}
}

// greets reports whether the peer at addr completes a ZMTP handshake
// with a socket of type typ (NULL security, as the sockets dialling it
// use) within timeout. The whole handshake, not only the greeting, so
// that the peer sees a connection that simply closes after it, which
// ZMQ libraries take silently.
func greets(ctx context.Context, addr string, typ zmq4.SocketType, timeout time.Duration) error {
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := zmq4.Open(conn, nullSecurity{}, typ, nil, false, nil); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w within %v: %w", ErrNoGreeting, timeout, err)
	}
	return nil
}

// nullSecurity is ZMTP's NULL mechanism: the peers exchange READY
// commands with their metadata (socket type, identity), nothing else.
type nullSecurity struct{}

func (nullSecurity) Type() zmq4.SecurityType { return zmq4.NullSecurity }

func (nullSecurity) Handshake(conn *zmq4.Conn, _ bool) error {
	raw, err := conn.Meta.MarshalZMTP()
	if err != nil {
		return err
	}
	if err := conn.SendCmd(zmq4.CmdReady, raw); err != nil {
		return err
	}
	cmd, err := conn.RecvCmd()
	if err != nil {
		return err
	}
	if cmd.Name != zmq4.CmdReady {
		return fmt.Errorf("the peer sent %q, not READY", cmd.Name)
	}
	return conn.Peer.Meta.UnmarshalZMTP(cmd.Body)
}

func (nullSecurity) Encrypt(w io.Writer, data []byte) (int, error) { return w.Write(data) }

func (nullSecurity) Decrypt(w io.Writer, data []byte) (int, error) { return w.Write(data) }
