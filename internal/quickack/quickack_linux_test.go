package quickack

import (
	"bytes"
	"context"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// pair returns the two ends of a loopback TCP connection.
func pair(t testing.TB) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// armed reports Armed(c): whether the connection is out of its
// delayed-acknowledgement ("pingpong") mode.
func armed(t *testing.T, c net.Conn) bool {
	t.Helper()
	a, err := Armed(c.(syscall.Conn))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// pingpong drives c into Linux's delayed-acknowledgement mode the way a
// kept-alive HTTP connection gets there: requests answered at once.
func pingpong(t *testing.T, c, s net.Conn, read func([]byte) (int, error)) {
	t.Helper()
	buf := make([]byte, 16)
	for range 4 {
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(s, buf[:4]); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write([]byte("pong")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(readerFunc(read), buf[:4]); err != nil {
			t.Fatal(err)
		}
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

func TestWrapArmsQuickAckAfterEveryRead(t *testing.T) {
	c, s := pair(t)
	w := Wrap(c)
	if _, ok := w.(*conn); !ok {
		t.Fatalf("Wrap(*net.TCPConn) = %T, want the re-arming wrapper", w)
	}
	// Entering delayed-acknowledgement mode by hand, as the kernel does on
	// its own: every read must leave it again.
	for i := range 3 {
		raw, _ := c.SyscallConn()
		_ = raw.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 0)
		})
		if armed(t, c) {
			t.Fatalf("round %d: TCP_QUICKACK still set after clearing it", i)
		}
		pingpong(t, w, s, w.Read)
		if !armed(t, c) {
			t.Fatalf("round %d: TCP_QUICKACK not set after a read through Wrap", i)
		}
	}
}

func TestWrapKeepsTheStream(t *testing.T) {
	c, s := pair(t)
	w := Wrap(c)
	want := bytes.Repeat([]byte("0123456789abcdef"), 64<<10)
	go func() {
		_, _ = s.Write(want)
		_ = s.CloseWrite()
	}()
	var got bytes.Buffer
	// io.Copy takes the wrapper's WriteTo: it must read through Read.
	n, err := io.Copy(&got, w)
	if err != nil || n != int64(len(want)) || !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("copied %d bytes (err %v), equal %v; want %d", n, err, bytes.Equal(got.Bytes(), want), len(want))
	}
	if !armed(t, c) {
		t.Fatal("TCP_QUICKACK not set after a copy through WriteTo")
	}
	if _, err := w.Write([]byte("after")); err != nil {
		t.Fatalf("write through the wrapper: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("the wrapped connection is still open after closing the wrapper")
	}
}

func TestWrapLeavesOtherConnections(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if w := Wrap(a); w != a {
		t.Fatalf("Wrap(net.Pipe end) = %T, want the connection itself", w)
	}
}

func TestDialContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if s, err := ln.Accept(); err == nil {
			_, _ = s.Write([]byte("hello"))
			s.Close()
		}
	}()
	dial := DialContext(nil)
	c, err := dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*conn); !ok {
		t.Fatalf("dialed %T, want the re-arming wrapper", c)
	}
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "hello" {
		t.Fatalf("read %q, %v; want hello", got, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if c, err := DialContext(&net.Dialer{Timeout: time.Second})(ctx, "tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Fatal("dial with a cancelled context succeeded")
	}
}
