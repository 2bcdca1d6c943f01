package nixl_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/nixl"
)

func TestBackends(t *testing.T) {
	requireNIXL(t)
	a, err := nixl.New(nixl.Config{Name: "backends", Backends: []string{"UCX", "POSIX"}})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	plugins, err := a.Plugins()
	require.NoError(t, err)
	require.Contains(t, plugins, "UCX")
	require.Contains(t, plugins, "POSIX")
	bs := a.Backends()
	require.Len(t, bs, 2)
	require.Equal(t, "UCX", bs[0].Plugin())
	require.True(t, slices.Contains(bs[0].MemKinds(), transfer.DRAM), "UCX moves DRAM: %v", bs[0].MemKinds())
	require.Equal(t, "POSIX", bs[1].Plugin())
	require.True(t, slices.Contains(bs[1].MemKinds(), transfer.File), "POSIX moves files: %v", bs[1].MemKinds())
	_, err = a.CreateBackend("NO_SUCH_PLUGIN", nil)
	require.ErrorIs(t, err, transfer.ErrNotSupported)
	// A request restricted to the UCX backend runs.
	buf, err := transfer.AllocBuffer(8192)
	require.NoError(t, err)
	defer buf.Free()
	b, err := nixl.New(nixl.Config{Name: "backends-peer"})
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, a.RegisterMem(transfer.RegList{Kind: transfer.DRAM, Descs: []transfer.RegDesc{{Desc: buf.Desc(0, 4096)}}}))
	require.NoError(t, b.RegisterMem(transfer.RegList{Kind: transfer.DRAM, Descs: []transfer.RegDesc{{Desc: buf.Desc(4096, 4096)}}}))
	md, err := b.LocalMetadata()
	require.NoError(t, err)
	_, err = a.LoadRemoteMetadata(md)
	require.NoError(t, err)
	copy(buf.Bytes(), "hello, nixl")
	req, err := a.CreateRequest(transfer.Write,
		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{buf.Desc(0, 11)}},
		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{buf.Desc(4096, 11)}},
		"backends-peer", &transfer.RequestOptions{Backends: bs[:1], SkipDescMerge: true})
	require.NoError(t, err)
	_, err = req.Post()
	require.NoError(t, err)
	require.NoError(t, req.Wait(t.Context()))
	require.NoError(t, req.Release())
	require.Equal(t, "hello, nixl", string(buf.Bytes()[4096:4107]))
}

// TestNotFoundClassified checks the errors of the calls whose NIXL status
// is NIXL_CAPI_ERROR_NOT_FOUND, which means something different for each
// call: no backend for a memory kind when registering, and a remote agent
// whose metadata is no longer loaded when making or posting a request.
func TestNotFoundClassified(t *testing.T) {
	requireNIXL(t)
	a, err := nixl.New(nixl.Config{Name: "notfound-a"})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	b, err := nixl.New(nixl.Config{Name: "notfound-b"})
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	buf, err := transfer.AllocBuffer(8192)
	require.NoError(t, err)
	defer buf.Free()
	require.NoError(t, a.RegisterMem(transfer.RegList{Kind: transfer.DRAM, Descs: []transfer.RegDesc{{Desc: buf.Desc(0, 4096)}}}))
	require.NoError(t, b.RegisterMem(transfer.RegList{Kind: transfer.DRAM, Descs: []transfer.RegDesc{{Desc: buf.Desc(4096, 4096)}}}))
	md, err := b.LocalMetadata()
	require.NoError(t, err)
	ld := transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{buf.Desc(0, 64)}}
	rd := transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{buf.Desc(4096, 64)}}

	for _, tc := range []struct {
		name string
		// run returns the error to classify; b's metadata is loaded
		// before each case, since cases invalidate it.
		run  func(t *testing.T) error
		want error
	}{
		{"register memory of a kind no UCX backend moves", func(t *testing.T) error {
			return a.RegisterMem(transfer.RegList{Kind: transfer.Object, Descs: []transfer.RegDesc{{Desc: buf.Desc(0, 4096), Meta: []byte("key")}}})
		}, transfer.ErrNotSupported},
		{"post after the remote was invalidated", func(t *testing.T) error {
			req, err := a.CreateRequest(transfer.Write, ld, rd, "notfound-b", nil)
			require.NoError(t, err)
			defer func() { require.NoError(t, req.Release()) }()
			require.NoError(t, a.InvalidateRemoteMetadata("notfound-b"))
			_, err = req.Post()
			return err
		}, transfer.ErrUnknownAgent},
		{"make a request after the remote was invalidated", func(t *testing.T) error {
			lp, err := a.PrepDescList("", ld)
			require.NoError(t, err)
			defer func() { require.NoError(t, lp.Release()) }()
			rp, err := a.PrepDescList("notfound-b", rd)
			require.NoError(t, err)
			defer func() { require.NoError(t, rp.Release()) }()
			require.NoError(t, a.InvalidateRemoteMetadata("notfound-b"))
			_, err = a.MakeRequest(transfer.Write, lp, []int{0}, rp, []int{0}, nil)
			return err
		}, transfer.ErrUnknownAgent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.LoadRemoteMetadata(md)
			require.NoError(t, err)
			err = tc.run(t)
			require.ErrorIs(t, err, tc.want)
		})
	}
}

// TestLoadOwnMetadata loads an agent's own metadata, which NIXL refuses:
// the error wraps ErrInvalidParam, as NIXL classifies it, and
// ErrBadMetadata, which Agent.LoadRemoteMetadata documents.
func TestLoadOwnMetadata(t *testing.T) {
	requireNIXL(t)
	a, err := nixl.New(nixl.Config{Name: "own"})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	md, err := a.LocalMetadata()
	require.NoError(t, err)
	_, err = a.LoadRemoteMetadata(md)
	require.ErrorIs(t, err, transfer.ErrInvalidParam)
	require.ErrorIs(t, err, transfer.ErrBadMetadata)
}

// TestPostAfterLocalDeregistration posts requests whose local memory was
// deregistered after they were made. NIXL would move the bytes anyway,
// out of or into memory the host may have freed since, through the
// registration it freed (a crash, or a success that is not one); the agent
// refuses the post with ErrNotRegistered, even once the memory is
// registered again, since the request still names the old registration.
// A request made again works.
func TestPostAfterLocalDeregistration(t *testing.T) {
	requireNIXL(t)
	a, err := nixl.New(nixl.Config{Name: "dereg-a"})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	b, err := nixl.New(nixl.Config{Name: "dereg-b"})
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	buf, err := transfer.AllocBuffer(8192)
	require.NoError(t, err)
	defer buf.Free()
	local := transfer.RegList{Kind: transfer.DRAM, Descs: []transfer.RegDesc{{Desc: buf.Desc(0, 4096)}}}
	require.NoError(t, a.RegisterMem(local))
	require.NoError(t, b.RegisterMem(transfer.RegList{Kind: transfer.DRAM, Descs: []transfer.RegDesc{{Desc: buf.Desc(4096, 4096)}}}))
	md, err := b.LocalMetadata()
	require.NoError(t, err)
	_, err = a.LoadRemoteMetadata(md)
	require.NoError(t, err)
	ld := transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{buf.Desc(0, 64)}}
	rd := transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{buf.Desc(4096, 64)}}

	for _, tc := range []struct {
		name string
		// make makes the request; it is called again after the memory
		// was registered again.
		make func(t *testing.T) transfer.Request
	}{
		{"created", func(t *testing.T) transfer.Request {
			req, err := a.CreateRequest(transfer.Read, ld, rd, "dereg-b", nil)
			require.NoError(t, err)
			return req
		}},
		{"made from prepared lists", func(t *testing.T) transfer.Request {
			lp, err := a.PrepDescList("", ld)
			require.NoError(t, err)
			t.Cleanup(func() { _ = lp.Release() })
			rp, err := a.PrepDescList("dereg-b", rd)
			require.NoError(t, err)
			t.Cleanup(func() { _ = rp.Release() })
			req, err := a.MakeRequest(transfer.Read, lp, []int{0}, rp, []int{0}, nil)
			require.NoError(t, err)
			return req
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.make(t)
			defer func() { require.NoError(t, req.Release()) }()
			_, err := req.Post()
			require.NoError(t, err)
			require.NoError(t, req.Wait(t.Context()))

			require.NoError(t, a.DeregisterMem(local))
			_, err = req.Post()
			require.ErrorIs(t, err, transfer.ErrNotRegistered)

			require.NoError(t, a.RegisterMem(local))
			_, err = req.Post()
			require.ErrorIs(t, err, transfer.ErrNotRegistered)

			again := tc.make(t)
			defer func() { require.NoError(t, again.Release()) }()
			_, err = again.Post()
			require.NoError(t, err)
			require.NoError(t, again.Wait(t.Context()))
		})
	}
}

// TestDeregisterMemInUse deregisters the local memory of a READ still in
// progress. NIXL would free the registration under the running transfer
// and let the caller free the memory it still lands in; the agent refuses
// with ErrInProgress and keeps the memory registered, and deregisters it
// once the READ finished. The initiator runs without a progress thread,
// so the READ advances only while it is polled and is still running when
// DeregisterMem is called.
func TestDeregisterMemInUse(t *testing.T) {
	requireNIXL(t)
	const size = 64 << 20
	a, err := nixl.New(nixl.Config{Name: "inuse-a", NoProgressThread: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	b, err := nixl.New(nixl.Config{Name: "inuse-b"})
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	bufA, err := transfer.AllocBuffer(size)
	require.NoError(t, err)
	defer bufA.Free()
	bufB, err := transfer.AllocBuffer(size)
	require.NoError(t, err)
	defer bufB.Free()
	require.NoError(t, a.RegisterMem(bufA.RegList()))
	require.NoError(t, b.RegisterMem(bufB.RegList()))
	md, err := b.LocalMetadata()
	require.NoError(t, err)
	_, err = a.LoadRemoteMetadata(md)
	require.NoError(t, err)
	var ld, rd transfer.DescList
	for off := 0; off < size; off += 1 << 20 {
		ld.Descs = append(ld.Descs, bufA.Desc(off, 1<<20))
		rd.Descs = append(rd.Descs, bufB.Desc(off, 1<<20))
	}
	req, err := a.CreateRequest(transfer.Read, ld, rd, "inuse-b", nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, req.Release()) }()
	st, err := req.Post()
	require.NoError(t, err)
	require.Equal(t, transfer.StatusInProgress, st)

	require.ErrorIs(t, a.DeregisterMem(bufA.RegList()), transfer.ErrInProgress)
	require.NoError(t, req.Wait(t.Context()))
	require.NoError(t, a.DeregisterMem(bufA.RegList()))
}

// TestDeregisterNamedTwice checks that a deregistration naming one range
// twice is refused, also when the range was registered twice, and that
// each registration then goes in a call of its own, and at Close.
func TestDeregisterNamedTwice(t *testing.T) {
	requireNIXL(t)
	buf, err := transfer.AllocBuffer(8192)
	require.NoError(t, err)
	defer buf.Free()
	d := transfer.RegDesc{Desc: buf.Desc(0, 4096)}
	once := transfer.RegList{Kind: transfer.DRAM, Descs: []transfer.RegDesc{d}}
	twice := transfer.RegList{Kind: transfer.DRAM, Descs: []transfer.RegDesc{d, d}}
	for _, tc := range []struct {
		name string
		// deregister is the number of single deregistrations before Close.
		deregister int
	}{
		{"deregistered one by one", 2},
		{"one left for Close", 1},
		{"both left for Close", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := nixl.New(nixl.Config{Name: "twice"})
			require.NoError(t, err)
			require.NoError(t, a.RegisterMem(once))
			require.NoError(t, a.RegisterMem(once))
			require.ErrorIs(t, a.DeregisterMem(twice), transfer.ErrInvalidParam)
			for range tc.deregister {
				require.NoError(t, a.DeregisterMem(once))
			}
			if tc.deregister == 2 {
				require.ErrorIs(t, a.DeregisterMem(once), transfer.ErrNotRegistered)
			}
			require.NoError(t, a.Close())
		})
	}
}
