package transfer_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/tcp"
)

// maxFuzzDescs bounds the descriptor lists the fuzz target builds. A
// layout may describe up to 2^30 descriptors (Validate's bound), and the
// slice lists of such a remote take tens of GiB; the fuzzer checks the
// lists of smaller layouts and the validation of all.
const maxFuzzDescs = 1 << 16

// FuzzPeerInfo decodes peer info as a Puller's host receives it from
// another rank, and runs what AddPeer runs on it against local ranks of
// several tensor-parallel splits. It checks that a rejected input wraps
// ErrBadMetadata and leaves the destination untouched; that an accepted one
// has a valid layout and survives a round trip; that Compatible, Overlap
// and SliceLists agree with each other; that the slice lists pair
// descriptors of equal length, one per (layer, block, plane), each inside
// its layout's registered regions; and that a real Puller either adds the
// peer or returns one of its documented errors.
func FuzzPeerInfo(f *testing.F) {
	var locals []*rank
	var seedAgent *tcp.Agent
	for _, st := range []style{contiguousHND, perLayerKVOuter, paddedLayers} {
		for _, tp := range []int{1, 2, 4} {
			rk := newRank(f, tp, tp-1, st)
			locals = append(locals, rk)
			a, err := tcp.New(tcp.Config{Name: "seed"})
			if err != nil {
				f.Fatal(err)
			}
			if err := a.RegisterMem(rk.layout.RegList()); err != nil {
				f.Fatal(err)
			}
			info, err := transfer.NewPeerInfo(a, kvroute.WorkerKey{ID: 3, Rank: 1}, rk.layout)
			if err != nil {
				f.Fatal(err)
			}
			b, err := info.MarshalBinary()
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
			if seedAgent == nil {
				seedAgent = a
			} else {
				_ = a.Close()
			}
		}
	}
	defer seedAgent.Close()
	f.Add([]byte(`{"v":1,"worker":1,"agent":"a","metadata":"AA==","layout":{"layers":1,"blocks":1,"block_tokens":1,"kv_heads":1,"head_dim":1,"dtype_size":1,"bases":[4096]}}`))
	f.Add([]byte(`{"v":1,"worker":1,"agent":"a","metadata":"AA==","layout":{"layers":2,"blocks":536870912,"block_tokens":1,"kv_heads":1,"head_dim":1,"dtype_size":1,"bases":[4096]}}`))
	f.Add([]byte(`{"v":1,"worker":1,"agent":"a","metadata":"AA==","layout":{"layers":1,"blocks":8192,"block_tokens":1048576,"kv_heads":1,"head_dim":1048576,"dtype_size":1024,"bases":[4096]}}`))
	f.Add([]byte(`{"v":2}`))
	f.Add([]byte{})

	// A decode rank: its agent, and a Puller over its first layout.
	local := locals[0]
	agent, err := tcp.New(tcp.Config{Name: "decode"})
	if err != nil {
		f.Fatal(err)
	}
	defer agent.Close()
	if err := agent.RegisterMem(local.layout.RegList()); err != nil {
		f.Fatal(err)
	}
	puller, err := transfer.NewPuller(transfer.PullerConfig{Agent: agent, Worker: kvroute.WorkerKey{ID: 9}, Layout: local.layout,
		MaxPeerDescs: maxFuzzDescs})
	if err != nil {
		f.Fatal(err)
	}
	defer puller.Close()

	valid := transfer.PeerInfo{Worker: kvroute.WorkerKey{ID: 5}, Agent: "kept", Metadata: []byte{1}, Layout: local.layout}
	f.Fuzz(func(t *testing.T, in []byte) {
		p := valid
		p.Layout.Bases = append([]uintptr(nil), valid.Layout.Bases...)
		if err := p.UnmarshalBinary(in); err != nil {
			if !errors.Is(err, transfer.ErrBadMetadata) || !strings.Contains(err.Error(), "peer info") {
				t.Fatalf("error %q does not wrap ErrBadMetadata or name peer info", err)
			}
			if !reflect.DeepEqual(p, valid) {
				t.Fatalf("rejected input changed the peer info: %+v", p)
			}
			return
		}
		if err := p.Layout.Validate(); err != nil {
			t.Fatalf("accepted peer info with invalid layout: %v", err)
		}
		b, err := p.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var again transfer.PeerInfo
		if err := again.UnmarshalBinary(b); err != nil || !reflect.DeepEqual(again, p) {
			t.Fatalf("round trip: %v, %+v != %+v", err, again, p)
		}
		remote := &p.Layout
		for _, lr := range locals {
			checkPair(t, &lr.layout, remote)
		}
		if err := puller.AddPeer(p); err != nil {
			if !errors.Is(err, transfer.ErrMismatch) && !errors.Is(err, transfer.ErrBadMetadata) &&
				!errors.Is(err, transfer.ErrInvalidParam) && !errors.Is(err, transfer.ErrNotRegistered) {
				t.Fatalf("AddPeer: undocumented error %v", err)
			}
			return
		}
		if remote.NumDescs() > maxFuzzDescs {
			t.Fatalf("AddPeer accepted %d descriptors, above the bound of %d", remote.NumDescs(), maxFuzzDescs)
		}
		if err := puller.RemovePeer(p.Agent); err != nil {
			t.Fatalf("RemovePeer after AddPeer: %v", err)
		}
	})
}

// checkPair checks what AddPeer computes for local and remote.
func checkPair(t *testing.T, local, remote *transfer.Layout) {
	t.Helper()
	if err := transfer.Compatible(local, remote); err != nil {
		if !errors.Is(err, transfer.ErrMismatch) {
			t.Fatalf("Compatible: %v does not wrap ErrMismatch", err)
		}
		if _, _, err := transfer.SliceLists(local, remote); err == nil {
			t.Fatal("SliceLists of incompatible layouts succeeded")
		}
		return
	}
	hs, ok := transfer.Overlap(local, remote)
	if ok && (hs.Count <= 0 || hs.Local < 0 || hs.Remote < 0 || hs.Local+hs.Count > local.KVHeads || hs.Remote+hs.Count > remote.KVHeads) {
		t.Fatalf("overlap %+v outside heads %d and %d", hs, local.KVHeads, remote.KVHeads)
	}
	if remote.NumDescs() > maxFuzzDescs {
		return
	}
	ld, rd, err := transfer.SliceLists(local, remote)
	if ok != (err == nil) {
		t.Fatalf("Overlap %v but SliceLists error %v", ok, err)
	}
	if !ok {
		if !errors.Is(err, transfer.ErrMismatch) {
			t.Fatalf("SliceLists: %v does not wrap ErrMismatch", err)
		}
		return
	}
	if len(ld.Descs) != local.NumDescs() || len(rd.Descs) != remote.NumDescs() {
		t.Fatalf("slice lists of %d and %d descriptors for layouts of %d and %d",
			len(ld.Descs), len(rd.Descs), local.NumDescs(), remote.NumDescs())
	}
	n := min(len(ld.Descs), len(rd.Descs))
	for i := range n {
		if ld.Descs[i].Len != rd.Descs[i].Len {
			t.Fatalf("descriptor %d: %d local bytes for %d remote bytes", i, ld.Descs[i].Len, rd.Descs[i].Len)
		}
	}
	for _, c := range []struct {
		l  *transfer.Layout
		ds transfer.DescList
	}{{local, ld}, {remote, rd}} {
		regs := c.l.RegList()
		for i, d := range c.ds.Descs {
			if !covered(regs, d) {
				t.Fatalf("descriptor %d %#x+%d outside the layout's regions", i, d.Addr, d.Len)
			}
		}
	}
}

func covered(regs transfer.RegList, d transfer.Desc) bool {
	for _, r := range regs.Descs {
		if r.Covers(d) {
			return true
		}
	}
	return false
}

// FuzzLayoutValidate builds layouts from arbitrary fields, as a decoded
// remote layout may hold them, and checks that Validate accepts only
// layouts whose arithmetic holds: positive descriptor counts in range, head
// ranges inside the tensor-parallel group without overflow, every region
// inside the address space, and (for small layouts) planes that really
// are disjoint; and that a rejection wraps ErrInvalidParam and says
// "layout".
func FuzzLayoutValidate(f *testing.F) {
	for _, st := range []style{contiguousHND, perLayerKVOuter, paddedLayers} {
		for _, tp := range []int{1, 2, 4} {
			l := newRank(f, tp, tp-1, st).layout
			f.Add(int64(l.Layers), int64(l.Blocks), int64(l.BlockTokens), int64(l.KVHeads), int64(l.HeadDim), int64(l.DTypeSize),
				int64(l.Planes), int64(l.TPSize), int64(l.TPRank), l.PlaneStride, l.BlockStride, l.LayerStride, uint64(l.Bases[0]), len(l.Bases) > 1)
		}
	}
	f.Add(int64(1), int64(1), int64(1), int64(1)<<40, int64(1), int64(1), int64(1), int64(1)<<40, int64(1)<<40-1, uint64(0), uint64(0), uint64(0), uint64(4096), false)
	f.Add(int64(1), int64(8192), int64(1)<<20, int64(1), int64(1)<<20, int64(1)<<10, int64(0), int64(0), int64(0), uint64(0), uint64(0), uint64(0), uint64(4096), false)
	f.Fuzz(func(t *testing.T, layers, blocks, tokens, heads, dim, dtype, planes, tpSize, tpRank int64,
		planeStride, blockStride, layerStride, base uint64, perLayer bool) {
		l := transfer.Layout{
			Layers: int(layers), Blocks: int(blocks), BlockTokens: int(tokens), KVHeads: int(heads),
			HeadDim: int(dim), DTypeSize: int(dtype), Planes: int(planes), TPSize: int(tpSize), TPRank: int(tpRank),
			PlaneStride: planeStride, BlockStride: blockStride, LayerStride: layerStride,
			Bases: []uintptr{uintptr(base)},
		}
		if perLayer && l.Layers > 1 && l.Layers <= 64 {
			for i := 1; i < l.Layers; i++ {
				l.Bases = append(l.Bases, uintptr(base)+uintptr(i)*(1<<40))
			}
		}
		if err := l.Validate(); err != nil {
			if !errors.Is(err, transfer.ErrInvalidParam) || !strings.Contains(err.Error(), "layout") {
				t.Fatalf("error %q does not wrap ErrInvalidParam or name the layout", err)
			}
			return
		}
		n := l.NumDescs()
		if n <= 0 || n > 1<<30 {
			t.Fatalf("valid layout with %d descriptors", n)
		}
		first, count := l.HeadRange()
		if total := l.TotalKVHeads(); first < 0 || count <= 0 || total <= 0 || first+count > total || first+count < first {
			t.Fatalf("head range [%d, +%d) outside %d heads", first, count, total)
		}
		if tp := max(l.TPSize, 1); l.TotalKVHeads()/l.KVHeads != tp || l.TotalKVHeads()%l.KVHeads != 0 {
			t.Fatalf("%d kv heads × tp size %d overflow to %d", l.KVHeads, tp, l.TotalKVHeads())
		}
		for _, r := range l.RegList().Descs {
			if _, ok := r.End(); !ok {
				t.Fatalf("region %#x+%d wraps", r.Addr, r.Len)
			}
		}
		// The first and last plane of the first and last block of every
		// layer lie in the regions, however many descriptors there are.
		regs := l.RegList()
		np, hb := l.Planes, l.HeadBytes()*uint64(l.KVHeads)
		if np == 0 {
			np = 2
		}
		for _, layer := range []int{0, l.Layers - 1} {
			for _, block := range []int{0, l.Blocks - 1} {
				for _, plane := range []int{0, np - 1} {
					d := transfer.Desc{Addr: l.Addr(layer, block, plane), Len: hb, DevID: l.DevID}
					if !covered(regs, d) {
						t.Fatalf("layer %d block %d plane %d %#x+%d outside the regions", layer, block, plane, d.Addr, d.Len)
					}
				}
			}
		}
		if n > 4096 {
			return
		}
		ds := l.DescList().Descs
		if len(ds) != n {
			t.Fatalf("%d descriptors, NumDescs %d", len(ds), n)
		}
		for i, d := range ds {
			if !covered(regs, d) {
				t.Fatalf("descriptor %d %#x+%d outside the regions", i, d.Addr, d.Len)
			}
		}
		// Planes of one layer never overlap.
		perLayerDescs := n / l.Layers
		for i := range perLayerDescs {
			for j := range i {
				a, b := ds[i], ds[j]
				if a.Addr < b.Addr+uintptr(b.Len) && b.Addr < a.Addr+uintptr(a.Len) {
					t.Fatalf("descriptors %d and %d overlap", j, i)
				}
			}
		}
	})
}
