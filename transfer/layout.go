package transfer

import (
	"fmt"
	"math/bits"
	"slices"
)

// Layout describes where one tensor-parallel rank keeps its KV cache, and
// maps block ids to descriptors.
//
// A block of one layer holds Planes planes (K and V, or one latent plane for
// MLA). A plane holds the rank's KVHeads heads × BlockTokens tokens ×
// HeadDim values of DTypeSize bytes, heads outermost (vLLM's HND order), so
// any run of consecutive heads is one contiguous range: that is what lets a
// rank of one tensor-parallel split read its heads from a rank of another.
//
// The memory is one region for all layers (len(Bases) == 1, layers
// LayerStride apart) or one region per layer (len(Bases) == Layers). Inside
// a layer, block b plane p starts at b*BlockStride + p*PlaneStride, which
// covers both vLLM's [2][blocks] (FlashAttention) and [blocks][2]
// (FlashInfer) orders.
//
// Layout is plain data: it is serialised with PeerInfo and is safe to copy.
// Its methods do not modify it. Zero-valued optional fields take the
// defaults their comments give.
type Layout struct {
	// Layers, Blocks, BlockTokens, KVHeads, HeadDim and DTypeSize give the
	// shape; all must be positive. KVHeads counts the heads this rank holds.
	Layers      int `json:"layers"`
	Blocks      int `json:"blocks"`
	BlockTokens int `json:"block_tokens"`
	KVHeads     int `json:"kv_heads"`
	HeadDim     int `json:"head_dim"`
	DTypeSize   int `json:"dtype_size"`
	// Planes is the number of planes per block. Zero means 2 (K and V).
	Planes int `json:"planes,omitempty"`
	// TPSize and TPRank place this rank in its worker's tensor-parallel
	// group: it holds heads [TPRank*KVHeads, (TPRank+1)*KVHeads) of
	// KVHeads*TPSize. Zero TPSize means 1.
	TPSize int `json:"tp_size,omitempty"`
	TPRank int `json:"tp_rank,omitempty"`
	// Kind and DevID say what memory the regions are (DRAM device 0 by
	// default; VRAM and the GPU index for a GPU cache).
	Kind  MemKind `json:"mem,omitempty"`
	DevID uint64  `json:"dev,omitempty"`
	// Bases are the region start addresses: one, or one per layer.
	Bases []uintptr `json:"bases"`
	// PlaneStride is the distance between the planes of a block. Zero means
	// PlaneBytes (planes adjacent).
	PlaneStride uint64 `json:"plane_stride,omitempty"`
	// BlockStride is the distance between blocks. Zero means Planes ×
	// PlaneBytes (blocks adjacent, planes inside).
	BlockStride uint64 `json:"block_stride,omitempty"`
	// LayerStride is the distance between layers in a single region. Zero
	// means LayerBytes. Ignored for one region per layer.
	LayerStride uint64 `json:"layer_stride,omitempty"`
}

// maxLayoutDescs bounds Layers × Blocks × Planes, so descriptor lists and
// their int indices stay in range on every platform.
const maxLayoutDescs = 1 << 30

// maxKVHeads bounds the KV heads of a tensor-parallel group (KVHeads ×
// TPSize), so head indices and offsets cannot overflow.
const maxKVHeads = 1 << 24

// planes returns Planes with its default applied.
func (l *Layout) planes() int {
	if l.Planes == 0 {
		return 2
	}
	return l.Planes
}

// tpSize returns TPSize with its default applied.
func (l *Layout) tpSize() int {
	if l.TPSize == 0 {
		return 1
	}
	return l.TPSize
}

// HeadBytes returns the bytes of one head of one block plane.
func (l *Layout) HeadBytes() uint64 {
	return uint64(l.BlockTokens) * uint64(l.HeadDim) * uint64(l.DTypeSize)
}

// PlaneBytes returns the bytes of one plane of one block of one layer.
func (l *Layout) PlaneBytes() uint64 { return uint64(l.KVHeads) * l.HeadBytes() }

// BlockBytes returns the bytes of one block across all layers and planes.
func (l *Layout) BlockBytes() uint64 {
	return uint64(l.Layers) * uint64(l.planes()) * l.PlaneBytes()
}

func (l *Layout) planeStride() uint64 {
	if l.PlaneStride == 0 {
		return l.PlaneBytes()
	}
	return l.PlaneStride
}

func (l *Layout) blockStride() uint64 {
	if l.BlockStride == 0 {
		return uint64(l.planes()) * l.PlaneBytes()
	}
	return l.BlockStride
}

// LayerBytes returns the span of one layer: from its first byte to the end
// of its last plane.
func (l *Layout) LayerBytes() uint64 {
	return uint64(l.Blocks-1)*l.blockStride() + uint64(l.planes()-1)*l.planeStride() + l.PlaneBytes()
}

func (l *Layout) layerStride() uint64 {
	if l.LayerStride == 0 {
		return l.LayerBytes()
	}
	return l.LayerStride
}

// Validate reports whether the layout is complete and its planes do not
// overlap. Errors wrap ErrInvalidParam.
func (l *Layout) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: layout: "+format, append([]any{ErrInvalidParam}, args...)...)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", l.Layers}, {"blocks", l.Blocks}, {"block tokens", l.BlockTokens},
		{"kv heads", l.KVHeads}, {"head dim", l.HeadDim}, {"dtype size", l.DTypeSize}} {
		if f.v <= 0 {
			return bad("%s %d must be positive", f.name, f.v)
		}
	}
	if l.Planes < 0 || l.TPSize < 0 {
		return bad("negative planes or tp size")
	}
	if l.KVHeads > maxKVHeads || l.tpSize() > maxKVHeads || l.KVHeads*l.tpSize() > maxKVHeads {
		return bad("%d kv heads × tp size %d exceeds %d heads", l.KVHeads, l.tpSize(), maxKVHeads)
	}
	if l.TPRank < 0 || l.TPRank >= l.tpSize() {
		return bad("tp rank %d outside tp size %d", l.TPRank, l.tpSize())
	}
	if !l.Kind.Valid() {
		return bad("memory kind %d", l.Kind)
	}
	n, ok := mulWithin(maxLayoutDescs, uint64(l.Layers), uint64(l.Blocks), uint64(l.planes()))
	if !ok {
		return bad("%d layers × %d blocks × %d planes is too many descriptors", l.Layers, l.Blocks, l.planes())
	}
	// Guard the byte arithmetic of the other methods against overflow:
	// every product they form is checked here, so none of them wraps.
	const maxBytes = 1 << 50
	if l.PlaneStride > maxBytes || l.BlockStride > maxBytes || l.LayerStride > maxBytes {
		return bad("strides exceed 2^50 bytes")
	}
	plane, ok := mulWithin(maxBytes, uint64(l.BlockTokens), uint64(l.HeadDim), uint64(l.DTypeSize), uint64(l.KVHeads))
	if ok {
		_, ok = mulWithin(maxBytes, plane, n)
	}
	if !ok {
		return bad("sizes exceed 2^50 bytes")
	}
	// blockStride() is at most planes × plane bytes ≤ n × plane bytes, and
	// LayerBytes the sum of three terms of at most 2^50 each.
	if _, ok := mulWithin(maxBytes, l.blockStride(), uint64(l.Blocks)); !ok {
		return bad("block stride %d × %d blocks exceeds 2^50 bytes", l.blockStride(), l.Blocks)
	}
	if _, ok := mulWithin(maxBytes, l.planeStride(), uint64(l.planes())); !ok {
		return bad("plane stride %d × %d planes exceeds 2^50 bytes", l.planeStride(), l.planes())
	}
	if _, ok := mulWithin(maxBytes, l.layerStride(), uint64(l.Layers)); !ok {
		return bad("layer stride %d × %d layers exceeds 2^50 bytes", l.layerStride(), l.Layers)
	}
	switch len(l.Bases) {
	case 1:
		if l.Layers > 1 && l.layerStride() < l.LayerBytes() {
			return bad("layer stride %d shorter than a layer (%d bytes)", l.layerStride(), l.LayerBytes())
		}
	case l.Layers:
	default:
		return bad("%d bases for %d layers (want 1 or one per layer)", len(l.Bases), l.Layers)
	}
	for _, r := range l.RegList().Descs {
		if _, ok := r.End(); !ok {
			return bad("region at %#x wraps the address space", r.Addr)
		}
	}
	return l.checkPlanesDisjoint()
}

// mulWithin returns the product of xs and whether it is at most limit;
// unlike a plain product, it cannot wrap.
func mulWithin(limit uint64, xs ...uint64) (uint64, bool) {
	p := uint64(1)
	for _, x := range xs {
		hi, lo := bits.Mul64(p, x)
		if hi != 0 || lo > limit {
			return 0, false
		}
		p = lo
	}
	return p, true
}

// checkPlanesDisjoint reports whether the planes of one layer overlap.
func (l *Layout) checkPlanesDisjoint() error {
	planes := l.planes()
	if planes*l.Blocks == 1 {
		return nil
	}
	ps, bs, size := l.planeStride(), l.blockStride(), l.PlaneBytes()
	// The common shapes need no sort: planes inside adjacent-enough blocks,
	// or blocks inside planes far enough apart.
	if (ps >= size && bs >= uint64(planes-1)*ps+size) ||
		(bs >= size && ps >= uint64(l.Blocks-1)*bs+size) {
		return nil
	}
	offs := make([]uint64, 0, planes*l.Blocks)
	for b := range l.Blocks {
		for p := range planes {
			offs = append(offs, uint64(b)*bs+uint64(p)*ps)
		}
	}
	slices.Sort(offs)
	for i := 1; i < len(offs); i++ {
		if offs[i]-offs[i-1] < size {
			return fmt.Errorf("%w: layout: planes overlap at offset %d", ErrInvalidParam, offs[i])
		}
	}
	return nil
}

// RegList returns the regions to register: one, or one per layer.
func (l *Layout) RegList() RegList {
	out := RegList{Kind: l.Kind, Descs: make([]RegDesc, len(l.Bases))}
	size := l.LayerBytes()
	if len(l.Bases) == 1 {
		size = uint64(l.Layers-1)*l.layerStride() + l.LayerBytes()
	}
	for i, base := range l.Bases {
		out.Descs[i] = RegDesc{Desc: Desc{Addr: base, Len: size, DevID: l.DevID}}
	}
	return out
}

// Addr returns the address of a block's plane in a layer. Indexes are not
// checked.
func (l *Layout) Addr(layer, block, plane int) uintptr {
	var off uint64
	base := l.Bases[0]
	if len(l.Bases) == 1 {
		off = uint64(layer) * l.layerStride()
	} else {
		base = l.Bases[layer]
	}
	off += uint64(block)*l.blockStride() + uint64(plane)*l.planeStride()
	return base + uintptr(off)
}

// NumDescs returns the length of DescList: Layers × Blocks × Planes.
func (l *Layout) NumDescs() int { return l.Layers * l.Blocks * l.planes() }

// DescIndex returns the index of (layer, block, plane) in DescList.
func (l *Layout) DescIndex(layer, block, plane int) int {
	return (layer*l.Blocks+block)*l.planes() + plane
}

// DescList returns one descriptor per (layer, block, plane), in DescIndex
// order: the list engines prepare once with Agent.PrepDescList.
func (l *Layout) DescList() DescList {
	return l.sliceList(0, l.KVHeads)
}

// sliceList returns DescList restricted to count heads starting at head
// first of every plane.
func (l *Layout) sliceList(first, count int) DescList {
	planes := l.planes()
	out := DescList{Kind: l.Kind, Descs: make([]Desc, 0, l.NumDescs())}
	for layer := range l.Layers {
		for b := range l.Blocks {
			for p := range planes {
				out.Descs = append(out.Descs, l.headDesc(layer, b, p, first, count))
			}
		}
	}
	return out
}

// headDesc returns the descriptor of count heads from head first of one
// block plane.
func (l *Layout) headDesc(layer, block, plane, first, count int) Desc {
	hb := l.HeadBytes()
	return Desc{
		Addr:  l.Addr(layer, block, plane) + uintptr(uint64(first)*hb),
		Len:   uint64(count) * hb,
		DevID: l.DevID,
	}
}

// AppendIndices appends to dst the DescList indices of the given blocks:
// for each layer, for each block in order, each plane. Errors wrap
// ErrOutOfRange.
func (l *Layout) AppendIndices(dst []int, blocks []int) ([]int, error) {
	for _, b := range blocks {
		if b < 0 || b >= l.Blocks {
			return dst, fmt.Errorf("%w: block %d of %d", ErrOutOfRange, b, l.Blocks)
		}
	}
	planes := l.planes()
	for layer := range l.Layers {
		for _, b := range blocks {
			for p := range planes {
				dst = append(dst, l.DescIndex(layer, b, p))
			}
		}
	}
	return dst, nil
}

// BlockDescs returns the descriptors of the given blocks in AppendIndices
// order. Errors wrap ErrOutOfRange.
func (l *Layout) BlockDescs(blocks []int) (DescList, error) {
	return l.blockSlices(blocks, 0, l.KVHeads)
}

// blockSlices returns the descriptors of count heads from head first of the
// given blocks, in AppendIndices order.
func (l *Layout) blockSlices(blocks []int, first, count int) (DescList, error) {
	for _, b := range blocks {
		if b < 0 || b >= l.Blocks {
			return DescList{}, fmt.Errorf("%w: block %d of %d", ErrOutOfRange, b, l.Blocks)
		}
	}
	planes := l.planes()
	out := DescList{Kind: l.Kind, Descs: make([]Desc, 0, l.Layers*len(blocks)*planes)}
	for layer := range l.Layers {
		for _, b := range blocks {
			for p := range planes {
				out.Descs = append(out.Descs, l.headDesc(layer, b, p, first, count))
			}
		}
	}
	return out, nil
}
