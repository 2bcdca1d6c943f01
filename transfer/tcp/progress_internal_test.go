package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/transfer"
)

// The pace of the slow peers below: a piece every slowEvery, against an
// IOTimeout of slowTimeout, so that each stall is a seventy-fifth of the
// timeout (the margin a loaded machine running -race needs) and every
// frame takes 1.7 timeouts in all.
const (
	slowTimeout = 3 * time.Second
	slowEvery   = 40 * time.Millisecond
	// slowSmall is written in slowPiece pieces; slowLarge, whose writer
	// the peer holds up, is read in progressChunk pieces through kernel
	// buffers made small with shrinkBuffers. Both take 128 pieces, 5.1 s.
	slowPiece = 8 << 10
	slowSmall = 128 * slowPiece
	slowLarge = 128 * progressChunk
)

// writeSlowly writes data in pieces of n bytes, one every slowEvery.
func writeSlowly(c net.Conn, data []byte, n int) error {
	for len(data) > 0 {
		time.Sleep(slowEvery)
		k := min(n, len(data))
		if _, err := c.Write(data[:k]); err != nil {
			return err
		}
		data = data[k:]
	}
	return nil
}

// readSlowly fills dst in pieces of n bytes, one every slowEvery.
func readSlowly(c net.Conn, dst []byte, n int) error {
	for len(dst) > 0 {
		time.Sleep(slowEvery)
		k := min(n, len(dst))
		if _, err := io.ReadFull(c, dst[:k]); err != nil {
			return err
		}
		dst = dst[k:]
	}
	return nil
}

// pattern returns n bytes that differ from a zeroed buffer and from piece
// to piece (the period, 251, divides no piece size), built with copies
// rather than a loop over every byte, which the race detector makes slow.
func pattern(n int) []byte {
	seq := make([]byte, 251)
	for i := range seq {
		seq[i] = byte(i + 1)
	}
	return bytes.Repeat(seq, n/len(seq)+1)[:n:n]
}

// TestSlowFramesWithinIOTimeout moves frames that take several IOTimeouts
// in all but never stall for one: IOTimeout bounds a stall, not a frame,
// so each must succeed, on the target (reading a WRITE, sending a READ)
// and on the initiator (sending a WRITE, reading a READ). A frame that
// does stall for longer than IOTimeout still fails.
func TestSlowFramesWithinIOTimeout(t *testing.T) {
	t.Run("target reads a slow WRITE", func(t *testing.T) {
		t.Parallel()
		b, buf := newSlowAgent(t, "b", slowSmall)
		c := dialAgent(t, b, "b")
		data := pattern(slowSmall)
		h := reqHeader{kind: kindWrite, id: 1, count: 1, dataLen: slowSmall}
		frame := appendDesc(h.append(nil), buf.Desc(0, slowSmall))
		_, err := c.Write(frame)
		require.NoError(t, err)
		require.NoError(t, writeSlowly(c, data, slowPiece))
		resp := readResponse(t, c)
		require.Equal(t, statusOK, resp.status)
		require.Equal(t, data, buf.Bytes())
	})
	t.Run("target sends a READ to a slow reader", func(t *testing.T) {
		t.Parallel()
		b, buf := newSlowAgent(t, "b", slowLarge)
		copy(buf.Bytes(), pattern(slowLarge))
		c := dialAgent(t, b, "b")
		shrinkBuffers(t, c)
		shrinkBuffers(t, servedConn(b))
		h := reqHeader{kind: kindRead, id: 1, count: 1}
		_, err := c.Write(appendDesc(h.append(nil), buf.Desc(0, slowLarge)))
		require.NoError(t, err)
		resp := readResponse(t, c)
		require.Equal(t, statusOK, resp.status)
		require.Equal(t, uint64(slowLarge), resp.dataLen)
		got := make([]byte, slowLarge)
		require.NoError(t, readSlowly(c, got, progressChunk))
		require.True(t, bytes.Equal(pattern(slowLarge), got), "READ data differs")
	})
	t.Run("initiator reads a slow READ response", func(t *testing.T) {
		t.Parallel()
		a, buf, ln := slowPair(t, slowSmall)
		req := postSlow(t, a, transfer.Read, buf, slowSmall)
		target := acceptTarget(t, ln)
		h := target.readFrame()
		data := pattern(slowSmall)
		resp := respHeader{id: h.id, status: statusOK, dataLen: slowSmall}
		_, err := target.conn.Write(resp.append(nil))
		require.NoError(t, err)
		require.NoError(t, writeSlowly(target.conn, data, slowPiece))
		require.NoError(t, waitSlow(t, req))
		require.Equal(t, data, buf.Bytes())
	})
	t.Run("initiator sends a WRITE to a slow reader", func(t *testing.T) {
		t.Parallel()
		a, buf, ln := slowPair(t, slowLarge)
		copy(buf.Bytes(), pattern(slowLarge))
		// Connect first, to shrink the buffers before the WRITE.
		require.NoError(t, a.SendNotif("b", []byte("hi")))
		target := acceptTarget(t, ln)
		require.Equal(t, kindNotif, target.readFrame().kind)
		shrinkBuffers(t, target.conn)
		shrinkBuffers(t, connTo(a, "b"))
		req := postSlow(t, a, transfer.Write, buf, slowLarge)
		h := target.readFrame()
		got := make([]byte, slowLarge)
		require.NoError(t, readSlowly(target.conn, got, progressChunk))
		target.respond(h.id, nil)
		require.NoError(t, waitSlow(t, req))
		require.True(t, bytes.Equal(pattern(slowLarge), got), "WRITE data differs")
	})
	t.Run("initiator gives up on a READ response that stalls", func(t *testing.T) {
		t.Parallel()
		a, buf, ln := slowPair(t, slowSmall)
		req := postSlow(t, a, transfer.Read, buf, slowSmall)
		target := acceptTarget(t, ln)
		h := target.readFrame()
		resp := respHeader{id: h.id, status: statusOK, dataLen: slowSmall}
		_, err := target.conn.Write(append(resp.append(nil), make([]byte, slowSmall/2)...))
		require.NoError(t, err)
		err = waitSlow(t, req)
		require.ErrorIs(t, err, transfer.ErrRemoteDisconnect)
	})
}

// shrinkBuffers makes c's kernel buffers small, so that a slow peer holds
// its writer up at once rather than after the megabytes loopback buffers
// grow to.
func shrinkBuffers(t *testing.T, c net.Conn) {
	t.Helper()
	tc, ok := c.(*net.TCPConn)
	require.True(t, ok, "%T is not a TCP connection", c)
	require.NoError(t, tc.SetReadBuffer(64<<10))
	require.NoError(t, tc.SetWriteBuffer(64<<10))
}

// servedConn returns the one connection a serves.
func servedConn(a *Agent) net.Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	for c := range a.served {
		return c
	}
	return nil
}

// connTo returns a's dialled connection to remote.
func connTo(a *Agent, remote string) net.Conn {
	a.mu.Lock()
	c := a.remotes[remote].conn
	a.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

// newSlowAgent returns an agent with IOTimeout slowTimeout and n bytes of
// registered memory.
func newSlowAgent(t *testing.T, name string, n int) (*Agent, *transfer.Buffer) {
	t.Helper()
	a, err := New(Config{Name: name, IOTimeout: slowTimeout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	buf, err := transfer.AllocBuffer(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = buf.Free() })
	require.NoError(t, a.RegisterMem(buf.RegList()))
	return a, buf
}

// dialAgent connects to a as an initiator and completes the hello.
func dialAgent(t *testing.T, a *Agent, name string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", a.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	_, err = c.Write(hello{from: "initiator", to: name, incarnation: a.incarnation}.marshal())
	require.NoError(t, err)
	var st [1]byte
	_, err = io.ReadFull(c, st[:])
	require.NoError(t, err)
	require.Equal(t, statusOK, st[0])
	return c
}

// readResponse reads a response header and its message.
func readResponse(t *testing.T, c net.Conn) respHeader {
	t.Helper()
	var head [respHeadLen]byte
	_, err := io.ReadFull(c, head[:])
	require.NoError(t, err)
	h := parseRespHeader(head[:])
	_, err = io.CopyN(io.Discard, c, int64(h.msgLen))
	require.NoError(t, err)
	return h
}

// slowPair returns an agent with IOTimeout slowTimeout and n bytes of
// registered memory, which loaded the metadata of a scripted target "b"
// holding n bytes at 1 MiB, and the listener the target accepts on.
func slowPair(t *testing.T, n int) (*Agent, *transfer.Buffer, net.Listener) {
	t.Helper()
	a, buf := newSlowAgent(t, "a", n)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	md := metadata{name: "b", addr: ln.Addr().String(),
		regions: []region{{kind: transfer.DRAM, desc: transfer.Desc{Addr: 1 << 20, Len: uint64(n)}}}}
	_, err = a.LoadRemoteMetadata(md.marshal())
	require.NoError(t, err)
	return a, buf, ln
}

// postSlow posts op of the whole buffer to the scripted target "b".
func postSlow(t *testing.T, a *Agent, op transfer.Op, buf *transfer.Buffer, n int) transfer.Request {
	t.Helper()
	req, err := a.CreateRequest(op,
		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{buf.Desc(0, n)}},
		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{{Addr: 1 << 20, Len: uint64(n)}}}, "b", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = req.Release() })
	_, err = req.Post()
	require.NoError(t, err)
	return req
}

// waitSlow waits for req, failing the test if it hangs.
func waitSlow(t *testing.T, req transfer.Request) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := req.Wait(ctx)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "request hung")
	return err
}

// TestWriteBuffersKeepsOrder writes buffer lists of several shapes through
// progress.writeBuffers, which splits them into chunks of progressChunk
// bytes: the peer must read exactly their concatenation.
func TestWriteBuffersKeepsOrder(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sizes []int
	}{
		{"one small buffer", []int{19}},
		{"empty buffers between", []int{0, 3, 0, 5}},
		{"exactly one chunk", []int{progressChunk}},
		{"one byte past a chunk", []int{progressChunk + 1}},
		{"buffers straddling chunks", []int{3, progressChunk - 1, 2, 2*progressChunk + 7, 1}},
		{"many small buffers", slicesOf(3000, 1000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bufs net.Buffers
			var want []byte
			for i, n := range tc.sizes {
				b := bytes.Repeat([]byte{byte(i + 1)}, n)
				for j := range b {
					b[j] += byte(j)
				}
				bufs = append(bufs, b)
				want = append(want, b...)
			}
			client, server := net.Pipe()
			defer client.Close()
			defer server.Close()
			got := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(server)
				got <- b
			}()
			require.NoError(t, (&progress{conn: client, timeout: 10 * time.Second}).writeBuffers(bufs))
			require.NoError(t, client.Close())
			require.True(t, bytes.Equal(want, <-got), "bytes differ from the buffers' concatenation")
		})
	}
}

// slicesOf returns n sizes of size bytes.
func slicesOf(n, size int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = size
	}
	return out
}

// TestTruncatedHeaderTimesOut sends part of a frame header and stalls:
// the wait for a frame is unbounded, but once its first byte arrived the
// header must keep moving like the rest of the frame. The target drops
// the connection, and the initiator fails the request the response
// belonged to, after IOTimeout.
func TestTruncatedHeaderTimesOut(t *testing.T) {
	t.Run("request header to a target", func(t *testing.T) {
		t.Parallel()
		b, buf := newSlowAgent(t, "b", slowSmall)
		c := dialAgent(t, b, "b")
		h := reqHeader{kind: kindRead, id: 1, count: 1}
		frame := appendDesc(h.append(nil), buf.Desc(0, 8))
		_, err := c.Write(frame[:5])
		require.NoError(t, err)
		var one [1]byte
		_, err = c.Read(one[:])
		require.ErrorIs(t, err, io.EOF, "the target kept a connection stalled in a header")
	})
	t.Run("response header to an initiator", func(t *testing.T) {
		t.Parallel()
		a, buf, ln := slowPair(t, slowSmall)
		req := postSlow(t, a, transfer.Read, buf, slowSmall)
		target := acceptTarget(t, ln)
		h := target.readFrame()
		resp := respHeader{id: h.id, status: statusOK, dataLen: slowSmall}
		_, err := target.conn.Write(resp.append(nil)[:5])
		require.NoError(t, err)
		require.ErrorIs(t, waitSlow(t, req), transfer.ErrRemoteDisconnect)
	})
}
