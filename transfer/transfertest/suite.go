package transfertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/transfer"
)

// Factory returns a new agent with the given name, ready to register DRAM
// and to exchange metadata with other agents of the same factory. The
// suite closes every agent it gets.
type Factory func(t testing.TB, name string) transfer.Agent

// waitTimeout bounds every wait of the suite, so a broken backend fails
// instead of hanging.
const waitTimeout = 20 * time.Second

// bufSize is the memory each agent of a pair registers.
const bufSize = 1 << 20

// TestAgent runs the conformance suite against agents from newAgent.
func TestAgent(t *testing.T, newAgent Factory) {
	tests := []struct {
		name string
		fn   func(*testing.T, Factory)
	}{
		{"Metadata", testMetadata},
		{"WriteScattered", func(t *testing.T, f Factory) { testScattered(t, f, transfer.Write) }},
		{"ReadScattered", func(t *testing.T, f Factory) { testScattered(t, f, transfer.Read) }},
		{"PreppedLists", testPrepped},
		{"Repost", testRepost},
		{"Notifications", testNotifications},
		{"Concurrent", testConcurrent},
		{"Errors", testErrors},
		{"ClosedPeer", testClosedPeer},
		{"UseAfterClose", testUseAfterClose},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newAgent) })
	}
}

// pair is two agents that registered a buffer each and loaded each other's
// metadata: a initiates, b is the target.
type pair struct {
	a, b       transfer.Agent
	bufA, bufB *transfer.Buffer
}

func newPair(t *testing.T, newAgent Factory) *pair {
	t.Helper()
	p := &pair{
		a:    newAgent(t, "initiator"),
		b:    newAgent(t, "target"),
		bufA: alloc(t, bufSize),
		bufB: alloc(t, bufSize),
	}
	t.Cleanup(func() {
		_ = p.a.Close()
		_ = p.b.Close()
	})
	must(t, p.a.RegisterMem(p.bufA.RegList()))
	must(t, p.b.RegisterMem(p.bufB.RegList()))
	exchange(t, p.a, p.b)
	fill(p.bufA.Bytes(), 1)
	fill(p.bufB.Bytes(), 2)
	return p
}

// exchange makes a and b load each other's metadata.
func exchange(t testing.TB, a, b transfer.Agent) {
	t.Helper()
	for _, x := range [][2]transfer.Agent{{a, b}, {b, a}} {
		md, err := x[1].LocalMetadata()
		must(t, err)
		name, err := x[0].LoadRemoteMetadata(md)
		must(t, err)
		if name != x[1].Name() {
			t.Fatalf("LoadRemoteMetadata returned %q, want %q", name, x[1].Name())
		}
	}
}

func alloc(t testing.TB, n int) *transfer.Buffer {
	t.Helper()
	b, err := transfer.AllocBuffer(n)
	must(t, err)
	t.Cleanup(func() { _ = b.Free() })
	return b
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantErr(t testing.TB, err error, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want one wrapping %q", what, err, target)
	}
}

// fill writes a pattern that differs per seed and per offset.
func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
}

// segment is a byte range of a buffer.
type segment struct{ off, n int }

// scatter returns n disjoint segments of [0, size) in random order, each
// between 1 and maxLen bytes, deterministic for seed.
func scatter(seed uint64, n, size, maxLen int) []segment {
	r := rand.New(rand.NewPCG(seed, 7))
	slot := size / n
	segs := make([]segment, n)
	for i := range segs {
		l := 1 + r.IntN(min(maxLen, slot))
		segs[i] = segment{off: i*slot + r.IntN(slot-l+1), n: l}
	}
	r.Shuffle(n, func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
	return segs
}

// lists returns descriptor lists pairing local segment i with remote
// segment i, truncated to equal lengths.
func lists(bufL, bufR *transfer.Buffer, l, r []segment) (transfer.DescList, transfer.DescList) {
	ld := transfer.DescList{Kind: transfer.DRAM}
	rd := transfer.DescList{Kind: transfer.DRAM}
	for i := range l {
		n := min(l[i].n, r[i].n)
		ld.Descs = append(ld.Descs, bufL.Desc(l[i].off, n))
		rd.Descs = append(rd.Descs, bufR.Desc(r[i].off, n))
	}
	return ld, rd
}

// expected applies the transfer to copies of the buffers' contents.
func expected(op transfer.Op, local, remote []byte, ld, rd transfer.DescList, baseL, baseR uintptr) ([]byte, []byte) {
	l, r := bytes.Clone(local), bytes.Clone(remote)
	for i := range ld.Descs {
		lo, ro, n := int(ld.Descs[i].Addr-baseL), int(rd.Descs[i].Addr-baseR), int(ld.Descs[i].Len)
		if op == transfer.Write {
			copy(r[ro:ro+n], l[lo:lo+n])
		} else {
			copy(l[lo:lo+n], r[ro:ro+n])
		}
	}
	return l, r
}

func checkBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("%s: byte %d is %#x, want %#x", what, i, got[i], want[i])
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return c
}

// run posts req and waits for it, checking the status it reports.
func run(t testing.TB, req transfer.Request) {
	t.Helper()
	st, err := req.Post()
	must(t, err)
	if st != transfer.StatusInProgress && st != transfer.StatusDone {
		t.Fatalf("Post returned status %s", st)
	}
	must(t, req.Wait(ctx(t)))
	st, err = req.Status()
	must(t, err)
	if st != transfer.StatusDone {
		t.Fatalf("status after Wait is %s, want done", st)
	}
}

func waitNotif(t testing.TB, in *transfer.Inbox, from string, msg []byte) {
	t.Helper()
	n, err := in.Wait(ctx(t), transfer.From(from, msg))
	must(t, err)
	if !bytes.Equal(n.Msg, msg) {
		t.Fatalf("notification %q, want %q", n.Msg, msg)
	}
}

func testMetadata(t *testing.T, newAgent Factory) {
	p := newPair(t, newAgent)
	if p.a.Name() != "initiator" || p.b.Name() != "target" {
		t.Fatalf("names %q, %q", p.a.Name(), p.b.Name())
	}
	// Reloading the same metadata is allowed.
	md, err := p.b.LocalMetadata()
	must(t, err)
	name, err := p.a.LoadRemoteMetadata(md)
	must(t, err)
	if name != "target" {
		t.Fatalf("reload returned %q", name)
	}
	for _, bad := range [][]byte{nil, []byte("not metadata"), md[:len(md)/2]} {
		_, err := p.a.LoadRemoteMetadata(bad)
		wantErr(t, err, transfer.ErrBadMetadata, fmt.Sprintf("LoadRemoteMetadata(%d bytes)", len(bad)))
	}
	must(t, p.a.InvalidateRemoteMetadata("target"))
	wantErr(t, p.a.InvalidateRemoteMetadata("target"), transfer.ErrUnknownAgent, "second invalidate")
	ld, rd := lists(p.bufA, p.bufB, []segment{{0, 64}}, []segment{{0, 64}})
	_, err = p.a.CreateRequest(transfer.Write, ld, rd, "target", nil)
	wantErr(t, err, transfer.ErrUnknownAgent, "request after invalidate")
	// Loading again restores transfers.
	_, err = p.a.LoadRemoteMetadata(md)
	must(t, err)
	req, err := p.a.CreateRequest(transfer.Write, ld, rd, "target", nil)
	must(t, err)
	run(t, req)
	must(t, req.Release())
	checkBytes(t, "target after write", p.bufB.Bytes()[:64], p.bufA.Bytes()[:64])
}

func testScattered(t *testing.T, newAgent Factory, op transfer.Op) {
	p := newPair(t, newAgent)
	ld, rd := lists(p.bufA, p.bufB, scatter(11, 200, bufSize, 8<<10), scatter(12, 200, bufSize, 8<<10))
	wantA, wantB := expected(op, p.bufA.Bytes(), p.bufB.Bytes(), ld, rd, p.bufA.Addr(), p.bufB.Addr())
	msg := []byte("done-" + op.String())
	req, err := p.a.CreateRequest(op, ld, rd, "target", &transfer.RequestOptions{Notif: msg})
	must(t, err)
	run(t, req)
	must(t, req.Release())
	checkBytes(t, "initiator memory", p.bufA.Bytes(), wantA)
	checkBytes(t, "target memory", p.bufB.Bytes(), wantB)
	waitNotif(t, transfer.NewInbox(p.b), "initiator", msg)
}

func testPrepped(t *testing.T, newAgent Factory) {
	p := newPair(t, newAgent)
	const blocks, blockLen = 64, 4 << 10
	local := transfer.DescList{Kind: transfer.DRAM}
	remote := transfer.DescList{Kind: transfer.DRAM}
	for i := range blocks {
		local.Descs = append(local.Descs, p.bufA.Desc(i*blockLen, blockLen))
		remote.Descs = append(remote.Descs, p.bufB.Desc(bufSize/2+i*blockLen, blockLen))
	}
	lp, err := p.a.PrepDescList("", local)
	must(t, err)
	rp, err := p.a.PrepDescList("target", remote)
	must(t, err)
	if lp.Len() != blocks || rp.Len() != blocks || lp.Remote() != "" || rp.Remote() != "target" {
		t.Fatalf("prepared lists: len %d/%d remote %q/%q", lp.Len(), rp.Len(), lp.Remote(), rp.Remote())
	}
	inbox := transfer.NewInbox(p.b)
	for i, op := range []transfer.Op{transfer.Write, transfer.Read} {
		perm := rand.New(rand.NewPCG(uint64(i), 3)).Perm(blocks)
		li, ri := perm[:blocks/2], perm[blocks/2:]
		sel := func(l transfer.DescList, idx []int) transfer.DescList {
			out := transfer.DescList{Kind: l.Kind}
			for _, j := range idx {
				out.Descs = append(out.Descs, l.Descs[j])
			}
			return out
		}
		wantA, wantB := expected(op, p.bufA.Bytes(), p.bufB.Bytes(), sel(local, li), sel(remote, ri), p.bufA.Addr(), p.bufB.Addr())
		msg := []byte(fmt.Sprintf("prepped-%d", i))
		req, err := p.a.MakeRequest(op, lp, li, rp, ri, &transfer.RequestOptions{Notif: msg})
		must(t, err)
		run(t, req)
		must(t, req.Release())
		checkBytes(t, op.String()+" initiator memory", p.bufA.Bytes(), wantA)
		checkBytes(t, op.String()+" target memory", p.bufB.Bytes(), wantB)
		waitNotif(t, inbox, "initiator", msg)
	}
	_, err = p.a.MakeRequest(transfer.Read, lp, []int{0, blocks}, rp, []int{0, 1}, nil)
	wantErr(t, err, transfer.ErrOutOfRange, "local index out of range")
	_, err = p.a.MakeRequest(transfer.Read, lp, []int{0}, rp, []int{-1}, nil)
	wantErr(t, err, transfer.ErrOutOfRange, "negative remote index")
	_, err = p.a.MakeRequest(transfer.Read, lp, []int{0, 1}, rp, []int{0}, nil)
	wantErr(t, err, transfer.ErrInvalidParam, "index lists of different lengths")
	// A request outlives the lists it was made from.
	req, err := p.a.MakeRequest(transfer.Write, lp, []int{3}, rp, []int{5}, nil)
	must(t, err)
	must(t, lp.Release())
	must(t, rp.Release())
	wantErr(t, lp.Release(), transfer.ErrReleased, "second list release")
	run(t, req)
	must(t, req.Release())
	checkBytes(t, "block after list release", p.bufB.Bytes()[bufSize/2+5*blockLen:][:blockLen], p.bufA.Bytes()[3*blockLen:][:blockLen])
	_, err = p.a.MakeRequest(transfer.Write, lp, []int{0}, rp, []int{0}, nil)
	wantErr(t, err, transfer.ErrReleased, "request from released lists")
}

func testRepost(t *testing.T, newAgent Factory) {
	p := newPair(t, newAgent)
	ld, rd := lists(p.bufA, p.bufB, []segment{{4096, 8192}}, []segment{{65536, 8192}})
	req, err := p.a.CreateRequest(transfer.Write, ld, rd, "target", nil)
	must(t, err)
	defer func() { must(t, req.Release()) }()
	for round := range 3 {
		fill(p.bufA.Bytes()[4096:4096+8192], uint64(100+round))
		run(t, req)
		checkBytes(t, fmt.Sprintf("round %d", round), p.bufB.Bytes()[65536:65536+8192], p.bufA.Bytes()[4096:4096+8192])
	}
}

func testNotifications(t *testing.T, newAgent Factory) {
	p := newPair(t, newAgent)
	msgs := [][]byte{[]byte("first"), {}, bytes.Repeat([]byte{0xab}, 4096), []byte("last")}
	for _, m := range msgs {
		must(t, p.a.SendNotif("target", m))
	}
	inbox := transfer.NewInbox(p.b)
	for _, m := range msgs {
		waitNotif(t, inbox, "initiator", m)
	}
	// Both directions work, and the sender is the key.
	must(t, p.b.SendNotif("initiator", []byte("back")))
	waitNotif(t, transfer.NewInbox(p.a), "target", []byte("back"))
	wantErr(t, p.a.SendNotif("nobody", []byte("x")), transfer.ErrUnknownAgent, "notification to unknown agent")
}

func testConcurrent(t *testing.T, newAgent Factory) {
	p := newPair(t, newAgent)
	const workers, rounds = 8, 4
	slice := bufSize / workers
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				op := transfer.Write
				if r%2 == 1 {
					op = transfer.Read
				}
				segs := scatter(uint64(w*10+r), 16, slice, 4096)
				for i := range segs {
					segs[i].off += w * slice
				}
				ld, rd := lists(p.bufA, p.bufB, segs, segs)
				req, err := p.a.CreateRequest(op, ld, rd, "target", nil)
				if err != nil {
					errs <- err
					return
				}
				if _, err := req.Post(); err != nil {
					errs <- err
					return
				}
				err = req.Wait(ctx(t))
				if rerr := req.Release(); err == nil {
					err = rerr
				}
				if err != nil {
					errs <- err
					return
				}
				for _, s := range segs {
					a, b := p.bufA.Bytes()[s.off:s.off+s.n], p.bufB.Bytes()[s.off:s.off+s.n]
					if !bytes.Equal(a, b) {
						errs <- fmt.Errorf("worker %d round %d: segment at %d differs", w, r, s.off)
						return
					}
				}
				fill(p.bufA.Bytes()[w*slice:(w+1)*slice], uint64(1000+w*10+r))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testErrors(t *testing.T, newAgent Factory) {
	p := newPair(t, newAgent)
	other := alloc(t, 4096)
	good := []segment{{0, 256}}
	ld, rd := lists(p.bufA, p.bufB, good, good)

	unregL := transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{other.Desc(0, 256)}}
	_, err := p.a.CreateRequest(transfer.Write, unregL, rd, "target", nil)
	wantErr(t, err, transfer.ErrNotRegistered, "unregistered local memory")
	_, err = p.a.PrepDescList("", unregL)
	wantErr(t, err, transfer.ErrNotRegistered, "prepare unregistered local memory")

	// Past the end of the target's registered buffer.
	pastEnd := transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{p.bufB.Desc(bufSize-128, 256)}}
	err = createAndRun(t, p.a, transfer.Read, ld, pastEnd, "target")
	wantErr(t, err, transfer.ErrNotRegistered, "remote descriptor past the registered end")

	_, err = p.a.CreateRequest(transfer.Write, ld, rd, "nobody", nil)
	wantErr(t, err, transfer.ErrUnknownAgent, "request to unknown agent")
	_, err = p.a.PrepDescList("nobody", rd)
	wantErr(t, err, transfer.ErrUnknownAgent, "list of unknown agent")

	two, _ := lists(p.bufA, p.bufB, []segment{{0, 64}, {64, 64}}, []segment{{0, 64}, {64, 64}})
	_, err = p.a.CreateRequest(transfer.Write, two, rd, "target", nil)
	wantErr(t, err, transfer.ErrInvalidParam, "lists of different lengths")

	wantErr(t, p.a.DeregisterMem(other.RegList()), transfer.ErrNotRegistered, "deregister unknown memory")

	req, err := p.a.CreateRequest(transfer.Write, ld, rd, "target", nil)
	must(t, err)
	if err := req.Wait(ctx(t)); err == nil {
		t.Fatal("Wait on a request never posted returned nil")
	}
	must(t, req.Release())
	wantErr(t, req.Release(), transfer.ErrReleased, "second release")
	_, err = req.Post()
	wantErr(t, err, transfer.ErrReleased, "post after release")

	// Deregistered memory cannot be used any more.
	must(t, p.a.DeregisterMem(p.bufA.RegList()))
	_, err = p.a.CreateRequest(transfer.Write, ld, rd, "target", nil)
	wantErr(t, err, transfer.ErrNotRegistered, "deregistered local memory")
}

// createAndRun creates, posts and waits for a request, returning the first
// error of the three steps.
func createAndRun(t testing.TB, a transfer.Agent, op transfer.Op, ld, rd transfer.DescList, remote string) error {
	req, err := a.CreateRequest(op, ld, rd, remote, nil)
	if err != nil {
		return err
	}
	defer func() { _ = req.Release() }()
	if _, err := req.Post(); err != nil {
		return err
	}
	err = req.Wait(ctx(t))
	st, serr := req.Status()
	if err == nil && st != transfer.StatusDone {
		t.Fatalf("Wait returned nil with status %s (%v)", st, serr)
	}
	if err != nil && st == transfer.StatusDone {
		t.Fatalf("Wait failed (%v) but status is done", err)
	}
	return err
}

func testClosedPeer(t *testing.T, newAgent Factory) {
	p := newPair(t, newAgent)
	ld, rd := lists(p.bufA, p.bufB, []segment{{0, 4096}}, []segment{{0, 4096}})
	must(t, createAndRun(t, p.a, transfer.Write, ld, rd, "target"))
	must(t, p.b.Close())
	for _, op := range []transfer.Op{transfer.Write, transfer.Read} {
		err := createAndRun(t, p.a, op, ld, rd, "target")
		if err == nil {
			t.Fatalf("%s to a closed peer succeeded", op)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s to a closed peer did not fail within %s", op, waitTimeout)
		}
	}
	if err := p.a.SendNotif("target", []byte("x")); err != nil && !errors.Is(err, transfer.ErrRemoteDisconnect) && !errors.Is(err, transfer.ErrBackend) {
		t.Fatalf("notification to a closed peer: %v", err)
	}
}

func testUseAfterClose(t *testing.T, newAgent Factory) {
	p := newPair(t, newAgent)
	ld, rd := lists(p.bufA, p.bufB, []segment{{0, 64}}, []segment{{0, 64}})
	req, err := p.a.CreateRequest(transfer.Write, ld, rd, "target", nil)
	must(t, err)
	lp, err := p.a.PrepDescList("", ld)
	must(t, err)
	rp, err := p.a.PrepDescList("target", rd)
	must(t, err)
	must(t, p.a.Close())
	_, err = p.a.MakeRequest(transfer.Write, lp, []int{0}, rp, []int{0}, nil)
	wantErr(t, err, transfer.ErrClosed, "MakeRequest")
	wantErr(t, p.a.Close(), transfer.ErrClosed, "second Close")
	wantErr(t, p.a.RegisterMem(p.bufA.RegList()), transfer.ErrClosed, "RegisterMem")
	_, err = p.a.LocalMetadata()
	wantErr(t, err, transfer.ErrClosed, "LocalMetadata")
	_, err = p.a.CreateRequest(transfer.Write, ld, rd, "target", nil)
	wantErr(t, err, transfer.ErrClosed, "CreateRequest")
	_, err = p.a.Notifs()
	wantErr(t, err, transfer.ErrClosed, "Notifs")
	wantErr(t, p.a.SendNotif("target", nil), transfer.ErrClosed, "SendNotif")
	_, err = req.Post()
	wantErr(t, err, transfer.ErrClosed, "Post")
	if err := req.Release(); !errors.Is(err, transfer.ErrClosed) && !errors.Is(err, transfer.ErrReleased) {
		t.Fatalf("Release after Close: %v", err)
	}
	if err := lp.Release(); !errors.Is(err, transfer.ErrClosed) && !errors.Is(err, transfer.ErrReleased) {
		t.Fatalf("list Release after Close: %v", err)
	}
}
