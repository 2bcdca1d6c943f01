package tcp

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/transfer"
)

// scriptedTarget is the target end of one connection, driven step by step
// by a test: it speaks the wire protocol by hand so the test decides when
// it reads and when it stops.
type scriptedTarget struct {
	t    *testing.T
	conn net.Conn
}

// acceptTarget accepts one connection on ln and answers its hello.
func acceptTarget(t *testing.T, ln net.Listener) *scriptedTarget {
	t.Helper()
	conn, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = readHello(conn)
	require.NoError(t, err)
	_, err = conn.Write([]byte{statusOK})
	require.NoError(t, err)
	return &scriptedTarget{t: t, conn: conn}
}

// readFrame reads a request frame up to its data, which it leaves unread.
func (s *scriptedTarget) readFrame() reqHeader {
	var head [reqHeaderLen]byte
	_, err := io.ReadFull(s.conn, head[:])
	require.NoError(s.t, err)
	h, err := parseReqHeader(head[:])
	require.NoError(s.t, err)
	_, err = io.CopyN(io.Discard, s.conn, int64(h.count)*descWireLen+int64(h.notifLen))
	require.NoError(s.t, err)
	return h
}

// respond sends a successful response carrying data.
func (s *scriptedTarget) respond(id uint64, data []byte) {
	h := respHeader{id: id, status: statusOK, dataLen: uint64(len(data))}
	_, err := s.conn.Write(append(h.append(nil), data...))
	require.NoError(s.t, err)
}

// queued returns the number of frames queued on the agent's connection to
// remote.
func queued(a *Agent, remote string) int {
	a.mu.Lock()
	c := a.remotes[remote].conn
	a.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// TestWriteFailureFailsRestOfBatch kills a connection while the sender
// holds a batch of several frames: the frames after the failed one must
// finish too. The batch holds a WRITE and the notification that completes
// a READ whose data already landed; the READ must not stay in progress.
func TestWriteFailureFailsRestOfBatch(t *testing.T) {
	const big = 32 << 20
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	a, err := New(Config{Name: "a", IOTimeout: time.Second})
	require.NoError(t, err)
	defer a.Close()
	buf, err := transfer.AllocBuffer(big + 16)
	require.NoError(t, err)
	defer buf.Free()
	require.NoError(t, a.RegisterMem(buf.RegList()))
	md := metadata{name: "b", addr: ln.Addr().String(),
		regions: []region{{kind: transfer.DRAM, desc: transfer.Desc{Addr: 1 << 20, Len: big}}}}
	_, err = a.LoadRemoteMetadata(md.marshal())
	require.NoError(t, err)

	post := func(op transfer.Op, off, n int, notif []byte) transfer.Request {
		t.Helper()
		var opts *transfer.RequestOptions
		if notif != nil {
			opts = &transfer.RequestOptions{Notif: notif}
		}
		req, err := a.CreateRequest(op,
			transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{buf.Desc(off, n)}},
			transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{{Addr: 1 << 20, Len: uint64(n)}}}, "b", opts)
		require.NoError(t, err)
		t.Cleanup(func() { _ = req.Release() })
		_, err = req.Post()
		require.NoError(t, err)
		return req
	}

	read := post(transfer.Read, 0, 16, []byte("n"))
	post(transfer.Write, 16, big, nil)
	target := acceptTarget(t, ln)
	hRead, hWrite := target.readFrame(), target.readFrame()
	require.Equal(t, uint8(kindRead), hRead.kind)
	require.Equal(t, uint8(kindWrite), hWrite.kind)

	// The sender is now busy with the first WRITE's data. Queue a second
	// WRITE, then land the READ's data, which queues its notification
	// behind that WRITE.
	post(transfer.Write, 16, big, nil)
	target.respond(hRead.id, make([]byte, 16))
	for queued(a, "b") < 2 {
		time.Sleep(time.Millisecond)
	}
	// Take the first WRITE and acknowledge it: the sender takes the second
	// WRITE and the notification as one batch, and the target reads no
	// more, so the WRITE times out.
	_, err = io.CopyN(io.Discard, target.conn, int64(hWrite.dataLen))
	require.NoError(t, err)
	target.respond(hWrite.id, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = read.Wait(ctx)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "READ stayed in progress after its connection died")
	require.ErrorIs(t, err, transfer.ErrRemoteDisconnect)
	st, _ := read.Status()
	require.Equal(t, transfer.StatusFailed, st)
}

// TestReleaseDuringCloseWaitsForCopy releases a READ, or deregisters its
// memory, while its data is being copied into local memory at the moment
// Close has marked the agent closed but not yet shut its connections:
// the call must still return only once no byte can land any more, or the
// caller frees memory the copy then writes into.
func TestReleaseDuringCloseWaitsForCopy(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(a *Agent, req transfer.Request, buf *transfer.Buffer) error
	}{
		{"Release", func(_ *Agent, req transfer.Request, _ *transfer.Buffer) error { return req.Release() }},
		{"DeregisterMem", func(a *Agent, _ transfer.Request, buf *transfer.Buffer) error { return a.DeregisterMem(buf.RegList()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 1 << 20
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer ln.Close()
			a, err := New(Config{Name: "a", IOTimeout: 10 * time.Second})
			require.NoError(t, err)
			defer a.Close()
			buf, err := transfer.AllocBuffer(size)
			require.NoError(t, err)
			defer buf.Free()
			require.NoError(t, a.RegisterMem(buf.RegList()))
			md := metadata{name: "b", addr: ln.Addr().String(),
				regions: []region{{kind: transfer.DRAM, desc: transfer.Desc{Addr: 1 << 20, Len: size}}}}
			_, err = a.LoadRemoteMetadata(md.marshal())
			require.NoError(t, err)
			req, err := a.CreateRequest(transfer.Read,
				transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{buf.Desc(0, size)}},
				transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{{Addr: 1 << 20, Len: size}}}, "b", nil)
			require.NoError(t, err)
			_, err = req.Post()
			require.NoError(t, err)
			target := acceptTarget(t, ln)
			h := target.readFrame()
			resp := respHeader{id: h.id, status: statusOK, dataLen: size}
			_, err = target.conn.Write(append(resp.append(nil), make([]byte, size/2)...))
			require.NoError(t, err)
			// Wait for the copy into local memory to start.
			r := req.(*request)
			for r.copyMu.TryLock() {
				r.copyMu.Unlock()
				time.Sleep(time.Millisecond)
			}

			// Close's first step: the agent is closed, its connections
			// not yet.
			a.mu.Lock()
			a.closed = true
			a.mu.Unlock()
			returned := make(chan error, 1)
			go func() { returned <- tc.call(a, req, buf) }()
			select {
			case err := <-returned:
				t.Fatalf("%s returned (%v) while the READ was still copying into local memory", tc.name, err)
			case <-time.After(200 * time.Millisecond):
			}
			// The rest of the data lands, the copy ends, and the call
			// returns.
			_, err = target.conn.Write(make([]byte, size/2))
			require.NoError(t, err)
			select {
			case err := <-returned:
				require.ErrorIs(t, err, transfer.ErrClosed)
			case <-time.After(20 * time.Second):
				t.Fatalf("%s did not return once the copy ended", tc.name)
			}
			a.mu.Lock()
			a.closed = false
			a.mu.Unlock()
		})
	}
}
