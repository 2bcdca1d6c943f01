package tcp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/tcp"
)

func newTCP(t *testing.T, name string) *tcp.Agent {
	t.Helper()
	a, err := tcp.New(tcp.Config{Name: name, IOTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func buffer(t *testing.T, n int) *transfer.Buffer {
	t.Helper()
	b, err := transfer.AllocBuffer(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Free() })
	return b
}

func link(t *testing.T, a, b transfer.Agent) {
	t.Helper()
	for _, x := range [][2]transfer.Agent{{a, b}, {b, a}} {
		md, err := x[1].LocalMetadata()
		require.NoError(t, err)
		_, err = x[0].LoadRemoteMetadata(md)
		require.NoError(t, err)
	}
}

// TestPeerDiesMidTransfer closes the target while a large READ and a large
// WRITE are in flight: both must fail with ErrRemoteDisconnect (or, if the
// data was already sent, succeed), never hang, and no notification of a
// partial WRITE may be delivered.
func TestPeerDiesMidTransfer(t *testing.T) {
	const size = 64 << 20
	for _, op := range []transfer.Op{transfer.Read, transfer.Write} {
		t.Run(op.String(), func(t *testing.T) {
			a, b := newTCP(t, "a"), newTCP(t, "b")
			ba, bb := buffer(t, size), buffer(t, size)
			require.NoError(t, a.RegisterMem(ba.RegList()))
			require.NoError(t, b.RegisterMem(bb.RegList()))
			link(t, a, b)
			descs := transfer.DescList{Kind: transfer.DRAM}
			for off := 0; off < size; off += 1 << 20 {
				descs.Descs = append(descs.Descs, ba.Desc(off, 1<<20))
			}
			rd := transfer.DescList{Kind: transfer.DRAM}
			for _, d := range descs.Descs {
				rd.Descs = append(rd.Descs, bb.Desc(int(d.Addr-ba.Addr()), int(d.Len)))
			}
			req, err := a.CreateRequest(op, descs, rd, "b", &transfer.RequestOptions{Notif: []byte("n")})
			require.NoError(t, err)
			defer func() { _ = req.Release() }()
			_, err = req.Post()
			require.NoError(t, err)
			require.NoError(t, b.Close())
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err = req.Wait(ctx)
			require.False(t, errors.Is(err, context.DeadlineExceeded), "transfer hung after the peer closed")
			st, serr := req.Status()
			if err != nil {
				require.ErrorIs(t, err, transfer.ErrRemoteDisconnect)
				require.Equal(t, transfer.StatusFailed, st)
				require.Equal(t, err, serr)
			} else {
				require.Equal(t, transfer.StatusDone, st)
			}
		})
	}
}

// TestReleaseCancels releases a READ while it runs: no byte may land in
// local memory afterwards, so the memory can be reused at once.
func TestReleaseCancels(t *testing.T) {
	const size = 32 << 20
	a, b := newTCP(t, "a"), newTCP(t, "b")
	ba, bb := buffer(t, size), buffer(t, size)
	require.NoError(t, a.RegisterMem(ba.RegList()))
	require.NoError(t, b.RegisterMem(bb.RegList()))
	link(t, a, b)
	src := bb.Bytes()
	for i := range src {
		src[i] = 0xff
	}
	req, err := a.CreateRequest(transfer.Read,
		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{ba.Desc(0, size)}},
		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{bb.Desc(0, size)}}, "b", nil)
	require.NoError(t, err)
	_, err = req.Post()
	require.NoError(t, err)
	require.NoError(t, req.Release())
	clear(ba.Bytes())
	// A later transfer on the same connection still works, and the
	// canceled one's data does not reappear.
	small, err := a.CreateRequest(transfer.Write,
		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{ba.Desc(0, 16)}},
		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{bb.Desc(0, 16)}}, "b", nil)
	require.NoError(t, err)
	_, err = small.Post()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, small.Wait(ctx))
	require.NoError(t, small.Release())
	for i, v := range ba.Bytes() {
		if v != 0 {
			t.Fatalf("byte %d of released READ landed after Release", i)
		}
	}
}

// TestHostilePeer speaks the wire protocol by hand: frames that reach
// outside registered memory are refused, malformed frames close the
// connection, and the agent keeps serving others.
func TestHostilePeer(t *testing.T) {
	b := newTCP(t, "b")
	bb := buffer(t, 4096)
	require.NoError(t, b.RegisterMem(bb.RegList()))
	dial := func(to string) net.Conn {
		c, err := net.Dial("tcp", b.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		hello := append([]byte("KVRX\x02"), le16(len("evil"))...)
		hello = append(append(hello, "evil"...), le16(len(to))...)
		hello = binary.LittleEndian.AppendUint64(append(hello, to...), incarnation(t, b))
		_, err = c.Write(hello)
		require.NoError(t, err)
		return c
	}
	frame := func(kind byte, addr uintptr, n uint64, data []byte) []byte {
		f := []byte{kind}
		f = binary.LittleEndian.AppendUint64(f, 7)
		f = binary.LittleEndian.AppendUint32(f, 1)
		f = append(f, 0)
		f = binary.LittleEndian.AppendUint32(f, 0)
		f = binary.LittleEndian.AppendUint64(f, uint64(len(data)))
		f = binary.LittleEndian.AppendUint64(f, uint64(addr))
		f = binary.LittleEndian.AppendUint64(f, n)
		f = binary.LittleEndian.AppendUint64(f, 0)
		return append(f, data...)
	}
	status := func(c net.Conn) byte {
		var h [19]byte
		_, err := io.ReadFull(c, h[:])
		require.NoError(t, err)
		msg := make([]byte, binary.LittleEndian.Uint16(h[9:]))
		_, err = io.ReadFull(c, msg)
		require.NoError(t, err)
		return h[8]
	}

	// Wrong agent name: refused with a message.
	c := dial("someone")
	var st [1]byte
	_, err := io.ReadFull(c, st[:])
	require.NoError(t, err)
	require.NotEqual(t, byte(0), st[0])

	c = dial("b")
	_, err = io.ReadFull(c, st[:])
	require.NoError(t, err)
	require.Equal(t, byte(0), st[0])
	// READ beyond the registered buffer, and of address 0.
	_, err = c.Write(frame(2, bb.Addr()+4000, 200, nil))
	require.NoError(t, err)
	require.NotEqual(t, byte(0), status(c))
	_, err = c.Write(frame(2, 0, 8, nil))
	require.NoError(t, err)
	require.NotEqual(t, byte(0), status(c))
	// WRITE wrapping the address space.
	_, err = c.Write(frame(1, ^uintptr(0)-4, 16, make([]byte, 16)))
	require.NoError(t, err)
	require.NotEqual(t, byte(0), status(c))
	// A good WRITE lands.
	_, err = c.Write(frame(1, bb.Addr()+8, 4, []byte{1, 2, 3, 4}))
	require.NoError(t, err)
	require.Equal(t, byte(0), status(c))
	require.Equal(t, []byte{1, 2, 3, 4}, bb.Bytes()[8:12])
	// A WRITE whose data length disagrees with its descriptors, then an
	// unknown frame kind: the connection is dropped.
	_, err = c.Write(frame(1, bb.Addr(), 100, make([]byte, 4)))
	require.NoError(t, err)
	_, err = io.ReadFull(c, st[:])
	require.Error(t, err)

	c = dial("b")
	_, err = io.ReadFull(c, st[:])
	require.NoError(t, err)
	_, err = c.Write(append([]byte{99}, make([]byte, 25)...))
	require.NoError(t, err)
	_, err = io.ReadFull(c, st[:])
	require.Error(t, err)

	// Garbage instead of a hello.
	g, err := net.Dial("tcp", b.Addr().String())
	require.NoError(t, err)
	defer g.Close()
	_, _ = g.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	require.NoError(t, g.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.ReadFull(g, st[:])
	require.Error(t, err)
}

func le16(n int) []byte { return binary.LittleEndian.AppendUint16(nil, uint16(n)) }

// incarnation returns the incarnation a's metadata gives, which a hello
// must name: it follows the magic, the version, the name and the address.
func incarnation(t *testing.T, a *tcp.Agent) uint64 {
	t.Helper()
	md, err := a.LocalMetadata()
	require.NoError(t, err)
	md = md[5:]
	for range 2 {
		md = md[2+int(binary.LittleEndian.Uint16(md)):]
	}
	return binary.LittleEndian.Uint64(md)
}

func TestConfig(t *testing.T) {
	_, err := tcp.New(tcp.Config{})
	require.ErrorIs(t, err, transfer.ErrInvalidParam)
	_, err = tcp.New(tcp.Config{Name: "x", ListenAddr: "256.0.0.1:1"})
	require.Error(t, err)
	a := newTCP(t, "a")
	plugins, err := a.Plugins()
	require.NoError(t, err)
	require.Equal(t, []string{"TCP"}, plugins)
	_, err = a.CreateBackend("UCX", nil)
	require.ErrorIs(t, err, transfer.ErrNotSupported)
	be, err := a.CreateBackend("TCP", nil)
	require.NoError(t, err)
	require.Equal(t, []transfer.MemKind{transfer.DRAM}, be.MemKinds())
	require.Len(t, a.Backends(), 1)
	err = a.RegisterMem(transfer.RegList{Kind: transfer.VRAM, Descs: []transfer.RegDesc{{Desc: transfer.Desc{Addr: 4096, Len: 4096}}}})
	require.ErrorIs(t, err, transfer.ErrNotSupported)
}

func FuzzLoadRemoteMetadata(f *testing.F) {
	a, err := tcp.New(tcp.Config{Name: "fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	defer a.Close()
	buf, err := transfer.AllocBuffer(4096)
	if err != nil {
		f.Fatal(err)
	}
	defer buf.Free()
	if err := a.RegisterMem(buf.RegList()); err != nil {
		f.Fatal(err)
	}
	md, err := a.LocalMetadata()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(md)
	f.Add([]byte("KVRT\x01"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		b, err := tcp.New(tcp.Config{Name: "loader"})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		name, err := b.LoadRemoteMetadata(in)
		if err != nil {
			require.ErrorIs(t, err, transfer.ErrBadMetadata)
			return
		}
		require.NotEmpty(t, name)
	})
}

// TestDeregisterUnusedMemoryDuringTransfers deregisters memory no transfer
// uses while large READs and a large WRITE run: it must neither wait for
// them nor disturb them.
func TestDeregisterUnusedMemoryDuringTransfers(t *testing.T) {
	const size = 64 << 20
	ioTimeout := 3 * time.Second
	a, err := tcp.New(tcp.Config{Name: "a", IOTimeout: ioTimeout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	b, err := tcp.New(tcp.Config{Name: "b", IOTimeout: ioTimeout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	ba, other, bb := buffer(t, 3*size), buffer(t, 4096), buffer(t, 3*size)
	require.NoError(t, a.RegisterMem(ba.RegList()))
	require.NoError(t, a.RegisterMem(other.RegList()))
	require.NoError(t, b.RegisterMem(bb.RegList()))
	link(t, a, b)
	var reqs []transfer.Request
	for i, op := range []transfer.Op{transfer.Read, transfer.Read, transfer.Write} {
		req, err := a.CreateRequest(op,
			transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{ba.Desc(i*size, size)}},
			transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{bb.Desc(i*size, size)}}, "b", nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = req.Release() })
		_, err = req.Post()
		require.NoError(t, err)
		reqs = append(reqs, req)
	}
	time.Sleep(2 * time.Millisecond)
	start := time.Now()
	require.NoError(t, a.DeregisterMem(other.RegList()))
	// Deregistering memory no transfer uses does not wait for the
	// transfers, let alone for a connection to time out.
	require.Less(t, time.Since(start), ioTimeout/2, "DeregisterMem of unused memory waited for transfers")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, req := range reqs {
		require.NoError(t, req.Wait(ctx), "request %d", i)
	}
}

// TestDeregisterMemoryInUse deregisters, on either side, the memory a
// large transfer is moving, then overwrites it at once: no byte may move
// into or out of the memory once DeregisterMem returned. The transfer
// either completes (it copied before the deregistration) or fails with
// ErrNotRegistered.
func TestDeregisterMemoryInUse(t *testing.T) {
	const size = 64 << 20
	tests := []struct {
		name   string
		op     transfer.Op
		target bool // the target deregisters, not the initiator
	}{
		{"initiator read", transfer.Read, false},
		{"initiator write", transfer.Write, false},
		{"target read", transfer.Read, true},
		{"target write", transfer.Write, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newTCP(t, "a"), newTCP(t, "b")
			ba, bb := buffer(t, size), buffer(t, size)
			require.NoError(t, a.RegisterMem(ba.RegList()))
			require.NoError(t, b.RegisterMem(bb.RegList()))
			link(t, a, b)
			// src is where the data comes from, dst where it goes;
			// gone is the buffer deregistered, with its agent.
			src, dst := bb, ba
			if tc.op == transfer.Write {
				src, dst = ba, bb
			}
			gone, owner := ba, transfer.Agent(a)
			if tc.target {
				gone, owner = bb, b
			}
			fill(src.Bytes(), 0x11)
			req, err := a.CreateRequest(tc.op,
				transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{ba.Desc(0, size)}},
				transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{bb.Desc(0, size)}}, "b", nil)
			require.NoError(t, err)
			defer func() { _ = req.Release() }()
			_, err = req.Post()
			require.NoError(t, err)
			time.Sleep(2 * time.Millisecond)
			require.NoError(t, owner.DeregisterMem(gone.RegList()))
			// From now on the deregistered memory is the caller's: a
			// source overwritten must not be sent, a destination
			// cleared must stay clear.
			mark := byte(0x22)
			if gone == dst {
				mark = 0
			}
			fill(gone.Bytes(), mark)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := req.Wait(ctx); err != nil {
				require.ErrorIs(t, err, transfer.ErrNotRegistered)
			}
			for i, v := range dst.Bytes() {
				if (gone == dst && v != 0) || (gone == src && v == 0x22) {
					t.Fatalf("byte %d moved after DeregisterMem returned", i)
				}
			}
		})
	}
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// TestRestartedAgentRefusesStaleMetadata restarts a target under the same
// name and address, registering memory at the same addresses: an
// initiator still holding the old agent's metadata must not read the new
// agent's memory as if it were the old one's blocks. Its transfers fail
// with ErrRemoteDisconnect until it loads the new metadata.
func TestRestartedAgentRefusesStaleMetadata(t *testing.T) {
	a := newTCP(t, "a")
	ba, bb := buffer(t, 4096), buffer(t, 4096)
	require.NoError(t, a.RegisterMem(ba.RegList()))
	b, err := tcp.New(tcp.Config{Name: "b", IOTimeout: 5 * time.Second})
	require.NoError(t, err)
	require.NoError(t, b.RegisterMem(bb.RegList()))
	link(t, a, b)
	ld := transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{ba.Desc(0, 64)}}
	rd := transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{bb.Desc(0, 64)}}
	read := func() error {
		t.Helper()
		req, err := a.CreateRequest(transfer.Read, ld, rd, "b", nil)
		require.NoError(t, err)
		defer func() { require.NoError(t, req.Release()) }()
		if _, err := req.Post(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return req.Wait(ctx)
	}
	require.NoError(t, read())

	addr := b.Addr().String()
	require.NoError(t, b.Close())
	b2, err := tcp.New(tcp.Config{Name: "b", ListenAddr: addr, IOTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b2.Close() })
	require.NoError(t, b2.RegisterMem(bb.RegList()))
	// The first READ may still find the old connection and fail on it;
	// every READ must fail while the old metadata is loaded.
	for range 3 {
		require.ErrorIs(t, read(), transfer.ErrRemoteDisconnect)
	}

	md, err := b2.LocalMetadata()
	require.NoError(t, err)
	_, err = a.LoadRemoteMetadata(md)
	require.NoError(t, err)
	require.NoError(t, read())
}

// TestLoadRemoteMetadataRefusesMismatch loads metadata no peer of an agent
// can have: its own, and a name no agent can take.
func TestLoadRemoteMetadataRefusesMismatch(t *testing.T) {
	a := newTCP(t, "a")
	own, err := a.LocalMetadata()
	require.NoError(t, err)
	long := renamed(own, strings.Repeat("n", 5000))
	for _, tc := range []struct {
		name string
		md   []byte
		want []error
	}{
		{"the agent's own", own, []error{transfer.ErrInvalidParam, transfer.ErrBadMetadata}},
		{"a name longer than any agent's", long, []error{transfer.ErrBadMetadata}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.LoadRemoteMetadata(tc.md)
			for _, w := range tc.want {
				require.ErrorIs(t, err, w)
			}
		})
	}
}

// renamed returns metadata md with its agent name replaced by name: the
// name follows the magic and the version.
func renamed(md []byte, name string) []byte {
	rest := md[5+2+int(binary.LittleEndian.Uint16(md[5:])):]
	out := append(append([]byte(nil), md[:5]...), le16(len(name))...)
	return append(append(out, name...), rest...)
}

// TestConfigRefusesBadValues gives New values it must refuse rather than
// start an agent that misbehaves later: negative bounds (a negative
// MaxQueuedNotifs made the first received notification panic) and an
// advertised address too long for the metadata's length field.
func TestConfigRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  tcp.Config
	}{
		{"negative MaxQueuedNotifs", tcp.Config{Name: "x", MaxQueuedNotifs: -1}},
		{"negative IOTimeout", tcp.Config{Name: "x", IOTimeout: -time.Second}},
		{"negative DialTimeout", tcp.Config{Name: "x", DialTimeout: -time.Second}},
		{"AdvertiseAddr past the metadata's bound", tcp.Config{Name: "x", AdvertiseAddr: strings.Repeat("h", 70_000) + ":1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := tcp.New(tc.cfg)
			if err == nil {
				_ = a.Close()
			}
			require.ErrorIs(t, err, transfer.ErrInvalidParam)
		})
	}
}

// TestWaitFinishedWithEndedContext waits for a finished transfer with a
// context that already ended: the transfer's result comes first, every
// time, or a caller retries a transfer that landed (and its notification
// arrives twice).
func TestWaitFinishedWithEndedContext(t *testing.T) {
	a, b := newTCP(t, "a"), newTCP(t, "b")
	ba, bb := buffer(t, 4096), buffer(t, 4096)
	require.NoError(t, a.RegisterMem(ba.RegList()))
	require.NoError(t, b.RegisterMem(bb.RegList()))
	link(t, a, b)
	req, err := a.CreateRequest(transfer.Write,
		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{ba.Desc(0, 64)}},
		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{bb.Desc(0, 64)}}, "b", nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, req.Release()) }()
	_, err = req.Post()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, req.Wait(ctx))
	ended, end := context.WithCancel(context.Background())
	end()
	for i := range 100 {
		require.NoError(t, req.Wait(ended), "wait %d", i)
	}
}
