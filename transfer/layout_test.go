package transfer_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/transfer"
)

// shape is the model used by the layout tests: 2 layers, 6 blocks of 4
// tokens, 8 KV heads in total of head dim 4, 2-byte values.
const (
	tLayers, tBlocks, tTokens, tHeads, tDim, tDType = 2, 6, 4, 8, 4, 2
)

// style selects how a test rank lays out its memory.
type style int

const (
	contiguousHND   style = iota // one region, blocks adjacent, K and V inside a block
	perLayerKVOuter              // a region per layer, all K planes then all V planes (FlashAttention)
	paddedLayers                 // one region, layers and blocks with padding between them
)

// rank is one tensor-parallel rank's KV cache in a Buffer.
type rank struct {
	buf    *transfer.Buffer
	layout transfer.Layout
}

func newRank(t testing.TB, tp, r int, st style) *rank {
	t.Helper()
	l := transfer.Layout{
		Layers: tLayers, Blocks: tBlocks, BlockTokens: tTokens,
		KVHeads: tHeads / tp, HeadDim: tDim, DTypeSize: tDType,
		TPSize: tp, TPRank: r,
	}
	plane := l.PlaneBytes()
	var size uint64
	switch st {
	case contiguousHND:
		size = uint64(tLayers) * tBlocks * 2 * plane
	case perLayerKVOuter:
		l.BlockStride, l.PlaneStride = plane, tBlocks*plane
		size = uint64(tLayers) * (l.LayerBytes() + 64)
	case paddedLayers:
		l.BlockStride = 2*plane + 32
		l.LayerStride = l.LayerBytes() + 96
		size = uint64(tLayers) * l.LayerStride
	}
	buf, err := transfer.AllocBuffer(int(size))
	require.NoError(t, err)
	t.Cleanup(func() { _ = buf.Free() })
	l.Bases = []uintptr{buf.Addr()}
	if st == perLayerKVOuter {
		l.Bases = []uintptr{buf.Addr(), buf.Addr() + uintptr(l.LayerBytes()+64)}
	}
	require.NoError(t, l.Validate())
	return &rank{buf: buf, layout: l}
}

// value is the byte a model element holds: a function of its layer, block,
// plane, global head, token, dimension and byte, so misplaced bytes show.
func value(layer, block, plane, head, tok, dim, b int) byte {
	x := uint32(layer*1_000_003 ^ block*10_007 ^ plane*101 ^ head*7919 ^ tok*131 ^ dim*17 ^ b)
	x ^= x >> 13
	x *= 0x5bd1e995
	return byte(x ^ x>>15)
}

// forEach calls fn with the buffer offset and coordinates of every byte of
// every element of the rank's given blocks.
func (r *rank) forEach(blocks []int, fn func(off int, layer, block, plane, head, tok, dim, b int)) {
	l := &r.layout
	first, _ := l.HeadRange()
	for layer := range l.Layers {
		for _, block := range blocks {
			for plane := range 2 {
				base := int(l.Addr(layer, block, plane) - r.buf.Addr())
				for h := range l.KVHeads {
					for tok := range l.BlockTokens {
						for dim := range l.HeadDim {
							for b := range l.DTypeSize {
								off := base + ((h*l.BlockTokens+tok)*l.HeadDim+dim)*l.DTypeSize + b
								fn(off, layer, block, plane, first+h, tok, dim, b)
							}
						}
					}
				}
			}
		}
	}
}

func allBlocks() []int {
	out := make([]int, tBlocks)
	for i := range out {
		out[i] = i
	}
	return out
}

// fillModel writes value() into every element of the rank.
func (r *rank) fillModel() {
	mem := r.buf.Bytes()
	r.forEach(allBlocks(), func(off, layer, block, plane, head, tok, dim, b int) {
		mem[off] = value(layer, block, plane, head, tok, dim, b)
	})
}

// check verifies that decode block dst[i] holds prefill block src[i] and
// that every other block is untouched (zero).
func (r *rank) check(t testing.TB, dst, src []int) {
	t.Helper()
	mem := r.buf.Bytes()
	from := map[int]int{}
	for i, b := range dst {
		from[b] = src[i]
	}
	bad := 0
	r.forEach(allBlocks(), func(off, layer, block, plane, head, tok, dim, b int) {
		want := byte(0)
		if sb, ok := from[block]; ok {
			want = value(layer, sb, plane, head, tok, dim, b)
		}
		if mem[off] != want && bad < 5 {
			bad++
			t.Errorf("rank %d/%d layer %d block %d plane %d head %d token %d dim %d byte %d: got %#x want %#x",
				r.layout.TPRank, r.layout.TPSize, layer, block, plane, head, tok, dim, b, mem[off], want)
		}
	})
}

func TestLayoutValidate(t *testing.T) {
	good := transfer.Layout{Layers: 2, Blocks: 4, BlockTokens: 16, KVHeads: 8, HeadDim: 128, DTypeSize: 2, Bases: []uintptr{1 << 20}}
	tests := []struct {
		name string
		edit func(*transfer.Layout)
		ok   bool
	}{
		{"good", func(*transfer.Layout) {}, true},
		{"per layer bases", func(l *transfer.Layout) { l.Bases = []uintptr{1 << 20, 1 << 30} }, true},
		{"mla single plane", func(l *transfer.Layout) { l.Planes = 1 }, true},
		{"flash attention strides", func(l *transfer.Layout) {
			l.BlockStride, l.PlaneStride = l.PlaneBytes(), 4*l.PlaneBytes()
		}, true},
		{"zero layers", func(l *transfer.Layout) { l.Layers = 0 }, false},
		{"negative head dim", func(l *transfer.Layout) { l.HeadDim = -1 }, false},
		{"no bases", func(l *transfer.Layout) { l.Bases = nil }, false},
		{"three bases for two layers", func(l *transfer.Layout) { l.Bases = []uintptr{1, 2, 3} }, false},
		{"tp rank out of range", func(l *transfer.Layout) { l.TPSize, l.TPRank = 2, 2 }, false},
		{"overlapping planes", func(l *transfer.Layout) { l.PlaneStride = l.PlaneBytes() / 2 }, false},
		{"overlapping blocks", func(l *transfer.Layout) { l.BlockStride = l.PlaneBytes() }, false},
		{"short layer stride", func(l *transfer.Layout) { l.LayerStride = 64 }, false},
		{"wrapping region", func(l *transfer.Layout) { l.Bases = []uintptr{^uintptr(0) - 100} }, false},
		{"bad memory kind", func(l *transfer.Layout) { l.Kind = 9 }, false},
		{"huge", func(l *transfer.Layout) { l.Blocks = 1 << 40 }, false},
		// Products that wrap uint64 must not pass for small ones.
		{"plane bytes × descriptors wraps to 0", func(l *transfer.Layout) {
			*l = transfer.Layout{Layers: 1, Blocks: 8192, BlockTokens: 1 << 20, KVHeads: 1, HeadDim: 1 << 20, DTypeSize: 1 << 10, Bases: []uintptr{1 << 12}}
		}, false},
		{"head bytes wrap", func(l *transfer.Layout) { l.BlockTokens, l.HeadDim, l.DTypeSize = 1<<32, 1<<32, 1 }, false},
		{"descriptor count wraps to 0", func(l *transfer.Layout) { l.Layers, l.Blocks, l.Planes = 1<<30, 1<<30, 16 }, false},
		{"block stride × blocks wraps", func(l *transfer.Layout) { l.Blocks, l.BlockStride = 1<<20, 1<<45 }, false},
		{"plane stride × planes wraps", func(l *transfer.Layout) { l.Planes, l.PlaneStride = 1<<20, 1<<45 }, false},
		{"layer stride × layers wraps", func(l *transfer.Layout) { l.Layers, l.LayerStride, l.Bases = 1<<20, 1<<45, []uintptr{1 << 20} }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := good
			l.Bases = slices.Clone(good.Bases)
			tc.edit(&l)
			err := l.Validate()
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, transfer.ErrInvalidParam)
			}
		})
	}
}

// TestPeerInfoWrappingLayout decodes a peer's layout whose span wraps
// uint64 to 0: it must be refused, or its regions would not cover its
// descriptors.
func TestPeerInfoWrappingLayout(t *testing.T) {
	in := `{"v":1,"worker":1,"agent":"a","metadata":"AA==","layout":{"layers":1,"blocks":8192,` +
		`"block_tokens":1048576,"kv_heads":1,"head_dim":1048576,"dtype_size":1024,"bases":[4096]}}`
	var p transfer.PeerInfo
	err := p.UnmarshalBinary([]byte(in))
	require.ErrorIs(t, err, transfer.ErrBadMetadata)
	require.ErrorIs(t, err, transfer.ErrInvalidParam)
}

func TestLayoutDescriptors(t *testing.T) {
	// vLLM-like: 16 tokens × 8 heads × 128 dims × 2 bytes = 32 KiB planes.
	l := transfer.Layout{Layers: 3, Blocks: 10, BlockTokens: 16, KVHeads: 8, HeadDim: 128, DTypeSize: 2, Bases: []uintptr{0x10000}}
	require.NoError(t, l.Validate())
	require.Equal(t, uint64(32<<10), l.PlaneBytes())
	require.Equal(t, uint64(3*2*32<<10), l.BlockBytes())
	require.Equal(t, 60, l.NumDescs())
	reg := l.RegList()
	require.Len(t, reg.Descs, 1)
	require.Equal(t, uint64(3*10*64<<10), reg.Descs[0].Len)

	all := l.DescList()
	require.Len(t, all.Descs, 60)
	require.Equal(t, transfer.Desc{Addr: 0x10000 + (1*10+4)*64<<10 + 32<<10, Len: 32 << 10}, all.Descs[l.DescIndex(1, 4, 1)])

	idx, err := l.AppendIndices(nil, []int{7, 2})
	require.NoError(t, err)
	require.Equal(t, []int{14, 15, 4, 5, 34, 35, 24, 25, 54, 55, 44, 45}, idx)
	bd, err := l.BlockDescs([]int{7, 2})
	require.NoError(t, err)
	for i, j := range idx {
		require.Equal(t, all.Descs[j], bd.Descs[i])
	}
	_, err = l.AppendIndices(nil, []int{10})
	require.ErrorIs(t, err, transfer.ErrOutOfRange)
}

func TestPeerRanks(t *testing.T) {
	tests := []struct {
		localTP, localRank, remoteTP int
		want                         []int
	}{
		{8, 0, 4, []int{0}},
		{8, 5, 4, []int{2}},
		{4, 1, 8, []int{2, 3}},
		{2, 1, 8, []int{4, 5, 6, 7}},
		{4, 3, 4, []int{3}},
		{1, 0, 2, []int{0, 1}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("tp%d.%d_from_tp%d", tc.localTP, tc.localRank, tc.remoteTP), func(t *testing.T) {
			l := transfer.Layout{KVHeads: 8 / tc.localTP, TPSize: tc.localTP, TPRank: tc.localRank}
			got, err := transfer.PeerRanks(&l, tc.remoteTP)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	_, err := transfer.PeerRanks(&transfer.Layout{KVHeads: 1, TPSize: 8}, 3)
	require.ErrorIs(t, err, transfer.ErrMismatch)
}

// TestMapBlocksTP moves blocks between every pair of ranks of two
// tensor-parallel splits by copying the mapped descriptors in memory, and
// checks every byte of every destination rank.
func TestMapBlocksTP(t *testing.T) {
	src, dst := []int{4, 0, 5}, []int{1, 2, 3}
	for _, tc := range []struct{ prefillTP, decodeTP int }{{4, 8}, {8, 4}, {2, 2}, {1, 8}, {8, 1}} {
		t.Run(fmt.Sprintf("prefill_tp%d_decode_tp%d", tc.prefillTP, tc.decodeTP), func(t *testing.T) {
			prefill := make([]*rank, tc.prefillTP)
			for r := range prefill {
				prefill[r] = newRank(t, tc.prefillTP, r, style(r%3))
				prefill[r].fillModel()
			}
			for d := range tc.decodeTP {
				dec := newRank(t, tc.decodeTP, d, style((d+1)%3))
				ranks, err := transfer.PeerRanks(&dec.layout, tc.prefillTP)
				require.NoError(t, err)
				for _, pr := range ranks {
					ld, rd, err := transfer.MapBlocks(&dec.layout, &prefill[pr].layout, dst, src)
					require.NoError(t, err)
					require.Len(t, ld.Descs, len(rd.Descs))
					for i := range ld.Descs {
						l, r := ld.Descs[i], rd.Descs[i]
						require.Equal(t, l.Len, r.Len)
						copy(dec.buf.Bytes()[l.Addr-dec.buf.Addr():][:l.Len], prefill[pr].buf.Bytes()[r.Addr-prefill[pr].buf.Addr():][:r.Len])
					}
				}
				dec.check(t, dst, src)
			}
		})
	}
}

func TestMapBlocksErrors(t *testing.T) {
	a := newRank(t, 2, 0, contiguousHND)
	b := newRank(t, 2, 1, contiguousHND)
	_, _, err := transfer.MapBlocks(&a.layout, &b.layout, []int{0}, []int{0})
	require.ErrorIs(t, err, transfer.ErrMismatch, "ranks with disjoint heads")
	c := newRank(t, 2, 0, contiguousHND)
	c.layout.HeadDim = 8
	_, _, err = transfer.MapBlocks(&a.layout, &c.layout, []int{0}, []int{0})
	require.ErrorIs(t, err, transfer.ErrMismatch, "different head dim")
	d := newRank(t, 2, 0, perLayerKVOuter)
	_, _, err = transfer.MapBlocks(&a.layout, &d.layout, []int{0, 1}, []int{0})
	require.ErrorIs(t, err, transfer.ErrMismatch, "block counts differ")
	_, _, err = transfer.MapBlocks(&a.layout, &d.layout, []int{0}, []int{tBlocks})
	require.ErrorIs(t, err, transfer.ErrOutOfRange)
}
