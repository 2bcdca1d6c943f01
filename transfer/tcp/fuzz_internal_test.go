package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/transfer"
)

// FuzzReadHello reads a connection's first bytes as a target does. A hello
// that reads is the one its bytes encode (names within maxNameLen, so the
// reader allocates at most that much per name); anything else is an error
// that says what was wrong.
func FuzzReadHello(f *testing.F) {
	f.Add(hello{from: "prefill-0", to: "decode-1", incarnation: 0x0123456789abcdef}.marshal())
	f.Add(hello{}.marshal())
	f.Add([]byte("KVRX\x03\x00\x00\x00\x00"))
	f.Add([]byte("KVRX\x01\x00\x00\x00\x00"))
	f.Add([]byte("KVRX\x02\xff\xff"))
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := readHello(bytes.NewReader(in))
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) &&
				!errors.Is(err, transfer.ErrInvalidParam) && !strings.Contains(err.Error(), "not a kvroute transfer connection") {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if len(h.from) > maxNameLen || len(h.to) > maxNameLen {
			t.Fatalf("names of %d and %d bytes", len(h.from), len(h.to))
		}
		if enc := h.marshal(); !bytes.HasPrefix(in, enc) {
			t.Fatalf("hello %+v re-encodes to %q, read from %q", h, enc, in)
		}
	})
}

// FuzzHeaders parses request and response headers as the two ends of a
// connection do. A request header that parses is within the frame bounds
// and re-encodes to its bytes (the notification flag normalised); a
// response header always re-encodes to its bytes.
func FuzzHeaders(f *testing.F) {
	for _, h := range []reqHeader{
		{kind: kindWrite, id: 1, count: 3, hasNotif: true, notifLen: 2, dataLen: 96},
		{kind: kindRead, id: 1 << 40, count: maxFrameDescs},
		{kind: kindNotif, id: 7, hasNotif: true, notifLen: maxNotifLen},
	} {
		f.Add(h.append(nil))
	}
	f.Add((&respHeader{id: 9, status: statusNotRegistered, msgLen: 12}).append(nil))
	f.Add(bytes.Repeat([]byte{0xff}, reqHeaderLen))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) >= respHeadLen {
			h := parseRespHeader(in)
			if enc := h.append(nil); !bytes.Equal(enc, in[:respHeadLen]) {
				t.Fatalf("response header %+v re-encodes to %x, read from %x", h, enc, in[:respHeadLen])
			}
		}
		if len(in) < reqHeaderLen {
			return
		}
		h, err := parseReqHeader(in)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if h.kind < kindWrite || h.kind > kindNotif || h.count > maxFrameDescs || h.notifLen > maxNotifLen ||
			h.kind == kindNotif && (h.count != 0 || h.dataLen != 0) {
			t.Fatalf("accepted header %+v", h)
		}
		want := bytes.Clone(in[:reqHeaderLen])
		if want[13] != 0 {
			want[13] = 1
		}
		if enc := h.append(nil); !bytes.Equal(enc, want) {
			t.Fatalf("request header %+v re-encodes to %x, read from %x", h, enc, want)
		}
	})
}

// fuzzBufLen is the registered memory of the fuzzed agents.
const fuzzBufLen = 4096

// newFuzzAgent returns an agent with fuzzBufLen bytes of registered memory
// filled with a pattern.
func newFuzzAgent(f *testing.F, name string) (*Agent, *transfer.Buffer) {
	a, err := New(Config{Name: name, IOTimeout: time.Second, DialTimeout: time.Second, MaxQueuedNotifs: 64})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = a.Close() })
	buf, err := transfer.AllocBuffer(fuzzBufLen)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = buf.Free() })
	if err := a.RegisterMem(buf.RegList()); err != nil {
		f.Fatal(err)
	}
	return a, buf
}

// FuzzServe runs the target side of a connection (readHello, the request
// loop, descriptor reading, WRITE, READ and notification handling) on a
// hello followed by arbitrary bytes, over an in-memory pipe. The connection
// must end once the bytes are consumed, every response must have a known
// status and announce no more data than was registered, and the agent's
// registered memory must still be registered afterwards.
func FuzzServe(f *testing.F) {
	a, buf := newFuzzAgent(f, "target")
	base := uint64(buf.Addr())
	frame := func(h reqHeader, descs []transfer.Desc, notif, data []byte) []byte {
		b := h.append(nil)
		for _, d := range descs {
			b = appendDesc(b, d)
		}
		return append(append(b, notif...), data...)
	}
	in := transfer.Desc{Addr: uintptr(base + 64), Len: 8}
	out := transfer.Desc{Addr: uintptr(base - 4096), Len: 8}
	f.Add(frame(reqHeader{kind: kindWrite, id: 1, count: 1, hasNotif: true, notifLen: 2, dataLen: 8}, []transfer.Desc{in}, []byte("ok"), []byte("12345678")))
	f.Add(frame(reqHeader{kind: kindRead, id: 2, count: 2}, []transfer.Desc{in, in}, nil, nil))
	f.Add(frame(reqHeader{kind: kindRead, id: 3, count: 1}, []transfer.Desc{out}, nil, nil))
	f.Add(frame(reqHeader{kind: kindWrite, id: 4, count: 1, dataLen: 8}, []transfer.Desc{out}, nil, []byte("abcdefgh")))
	f.Add(frame(reqHeader{kind: kindNotif, id: 5, hasNotif: true, notifLen: 3}, nil, []byte("hey"), nil))
	f.Add(frame(reqHeader{kind: kindRead, id: 6, count: 2}, []transfer.Desc{{Addr: 1, Len: 1 << 63}, {Addr: 1, Len: 1 << 63}}, nil, nil))
	f.Add([]byte{})
	hi := hello{from: "initiator", to: "target", incarnation: a.incarnation}.marshal()
	f.Fuzz(func(t *testing.T, in []byte) {
		client, server := net.Pipe()
		a.mu.Lock()
		a.served[server] = struct{}{}
		a.wg.Add(1)
		a.mu.Unlock()
		done := make(chan struct{})
		go func() {
			a.serve(server)
			close(done)
		}()
		// Read every response while the input is written.
		read := make(chan error, 1)
		go func() { read <- checkResponses(client) }()
		_ = client.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = client.Write(append(bytes.Clone(hi), in...))
		// The pipe's Write returns once the target has read every byte:
		// hang up.
		_ = client.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the target did not end the connection")
		}
		if err := <-read; err != nil {
			t.Fatal(err)
		}
		n := a.regs.count()
		if n != 1 {
			t.Fatalf("%d registered regions after the connection, want 1", n)
		}
		_, _ = a.Notifs()
	})
}

// checkResponses reads the target's status byte and responses until the
// connection ends.
func checkResponses(c net.Conn) error {
	var st [1]byte
	if _, err := io.ReadFull(c, st[:]); err != nil {
		return nil
	}
	if st[0] != statusOK {
		return errors.New("target refused a hello naming it")
	}
	var head [respHeadLen]byte
	for {
		if _, err := io.ReadFull(c, head[:]); err != nil {
			return nil
		}
		h := parseRespHeader(head[:])
		if h.status > statusUnknownAgent {
			return errors.New("response with an unknown status")
		}
		if h.dataLen > fuzzBufLen*uint64(maxFrameDescs) {
			return errors.New("response announcing more data than could be registered")
		}
		if _, err := io.CopyN(io.Discard, c, int64(h.msgLen)+int64(h.dataLen)); err != nil {
			return nil
		}
	}
}

// FuzzClientReceive runs the initiator side of a connection (handshake,
// receive, response handling, reading into local memory) against a target
// that answers a READ with arbitrary bytes: its status byte, then
// responses, the first header's id XORed with the READ's id so that zero
// bytes answer it. The READ must finish (done or failed with a transfer
// error) without hanging, and no local byte outside its descriptors may
// change.
func FuzzClientReceive(f *testing.F) {
	a, buf := newFuzzAgent(f, "initiator")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = ln.Close() })
	reply := make(chan []byte, 1)
	go fakeTarget(ln, reply)
	md := (&metadata{name: "target", addr: ln.Addr().String(),
		regions: []region{{kind: transfer.DRAM, desc: transfer.Desc{Addr: 1 << 20, Len: 1 << 20}}}}).marshal()
	if _, err := a.LoadRemoteMetadata(md); err != nil {
		f.Fatal(err)
	}
	local := transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{buf.Desc(128, 16), buf.Desc(512, 8)}}
	remote := transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{{Addr: 1 << 20, Len: 16}, {Addr: 1<<20 + 64, Len: 8}}}
	resp := func(h respHeader, msg string, data []byte) []byte {
		h.id = 0
		return append(append(h.append(nil), msg...), data...)
	}
	f.Add(append([]byte{statusOK}, resp(respHeader{dataLen: 24}, "", bytes.Repeat([]byte{7}, 24))...))
	f.Add(append([]byte{statusOK}, resp(respHeader{status: statusNotRegistered, msgLen: 4}, "nope", nil)...))
	f.Add(append([]byte{statusOK}, resp(respHeader{dataLen: 1 << 63}, "", nil)...))
	f.Add(append([]byte{statusOK}, resp(respHeader{status: statusInvalid, dataLen: 5}, "", nil)...))
	f.Add(append([]byte{statusUnknownAgent}, appendString(nil, "not here")...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		mem := buf.Bytes()
		for i := range mem {
			mem[i] = byte(i * 31)
		}
		req, err := a.CreateRequest(transfer.Read, local, remote, "target", &transfer.RequestOptions{Notif: []byte("n")})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = req.Release() }()
		reply <- in
		// A READ that never reached the target leaves its reply unread.
		defer func() {
			select {
			case <-reply:
			default:
			}
		}()
		// The connection is set up concurrently with Post: a target that
		// refuses the hello at once can fail the connection before Post
		// queues the READ, and then Post returns that failure itself.
		documented := func(err error) bool {
			return errors.Is(err, transfer.ErrRemoteDisconnect) || errors.Is(err, transfer.ErrBackend) ||
				errors.Is(err, transfer.ErrNotRegistered) || errors.Is(err, transfer.ErrInvalidParam) || errors.Is(err, transfer.ErrUnknownAgent)
		}
		if _, err := req.Post(); err != nil {
			if !documented(err) {
				t.Fatalf("post: %v", err)
			}
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = req.Wait(ctx)
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatal("READ hung on the target's reply")
		}
		if err != nil && !documented(err) {
			t.Fatalf("READ failed with %v", err)
		}
		for i := range mem {
			if (i >= 128 && i < 144) || (i >= 512 && i < 520) {
				continue
			}
			if mem[i] != byte(i*31) {
				t.Fatalf("byte %d outside the READ's descriptors changed", i)
			}
		}
		// The next READ dials again.
		_ = a.InvalidateRemoteMetadata("target")
		if _, err := a.LoadRemoteMetadata(md); err != nil {
			t.Fatal(err)
		}
	})
}

// fakeTarget answers each connection's hello and first request header with
// the next reply, the id of its first response header XORed with the
// request's, then closes the connection.
func fakeTarget(ln net.Listener, replies <-chan []byte) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		in := <-replies
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := readHello(c); err != nil {
			_ = c.Close()
			continue
		}
		out := bytes.Clone(in)
		if len(out) > 0 {
			_, _ = c.Write(out[:1])
			out = out[1:]
		}
		if len(in) > 0 && in[0] == statusOK && len(out) >= 8 {
			var head [reqHeaderLen]byte
			if _, err := io.ReadFull(c, head[:]); err == nil {
				id := binary.LittleEndian.Uint64(head[1:])
				binary.LittleEndian.PutUint64(out, binary.LittleEndian.Uint64(out)^id)
			}
		}
		go func() {
			_, _ = io.Copy(io.Discard, c)
		}()
		_, _ = c.Write(out)
		time.Sleep(time.Millisecond)
		_ = c.Close()
	}
}
