package transfer

import "fmt"

// HeadRange returns the first global KV head this rank holds and how many.
func (l *Layout) HeadRange() (first, count int) {
	return l.TPRank * l.KVHeads, l.KVHeads
}

// TotalKVHeads returns the KV heads of the whole tensor-parallel group.
func (l *Layout) TotalKVHeads() int { return l.KVHeads * l.tpSize() }

// HeadSlice is the part of two ranks' heads that one of them can read from
// the other: Count heads, starting at head Local of the local rank's planes
// and head Remote of the remote rank's.
type HeadSlice struct {
	Local, Remote, Count int
}

// Compatible reports whether blocks of local and remote hold the same
// tensors split differently: equal layers, planes, block tokens, head dim,
// dtype and total KV heads. Errors wrap ErrMismatch.
func Compatible(local, remote *Layout) error {
	type shape struct{ layers, planes, tokens, dim, dtype, heads int }
	a := shape{local.Layers, local.planes(), local.BlockTokens, local.HeadDim, local.DTypeSize, local.TotalKVHeads()}
	b := shape{remote.Layers, remote.planes(), remote.BlockTokens, remote.HeadDim, remote.DTypeSize, remote.TotalKVHeads()}
	if a != b {
		return fmt.Errorf("%w: layouts differ: local %+v, remote %+v", ErrMismatch, a, b)
	}
	return nil
}

// Overlap returns the heads local and remote have in common, and false when
// they share none. It assumes Compatible layouts.
func Overlap(local, remote *Layout) (HeadSlice, bool) {
	lf, lc := local.HeadRange()
	rf, rc := remote.HeadRange()
	first, end := max(lf, rf), min(lf+lc, rf+rc)
	if first >= end {
		return HeadSlice{}, false
	}
	return HeadSlice{Local: first - lf, Remote: first - rf, Count: end - first}, true
}

// PeerRanks returns the ranks of a remoteTP-way group that hold heads of
// local: one rank when remoteTP is a multiple of local's TP size (a rank of
// a wider split reads from one narrower rank), several when it is larger.
// Errors wrap ErrMismatch when the total heads do not split remoteTP ways.
func PeerRanks(local *Layout, remoteTP int) ([]int, error) {
	total := local.TotalKVHeads()
	if remoteTP <= 0 || total%remoteTP != 0 {
		return nil, fmt.Errorf("%w: %d kv heads do not split %d ways", ErrMismatch, total, remoteTP)
	}
	per := total / remoteTP
	first, count := local.HeadRange()
	var ranks []int
	for r := first / per; r*per < first+count; r++ {
		ranks = append(ranks, r)
	}
	return ranks, nil
}

// MapBlocks returns the descriptor lists that move the given blocks between
// two ranks: local[i] and remote[i] are the same bytes of the same layer,
// block and plane, restricted to the heads the ranks share. localBlocks[j]
// receives remoteBlocks[j]. Errors wrap ErrMismatch (incompatible layouts,
// no shared heads, different block counts) or ErrOutOfRange.
func MapBlocks(local, remote *Layout, localBlocks, remoteBlocks []int) (DescList, DescList, error) {
	hs, err := headSlice(local, remote)
	if err != nil {
		return DescList{}, DescList{}, err
	}
	if len(localBlocks) != len(remoteBlocks) {
		return DescList{}, DescList{}, fmt.Errorf("%w: %d local blocks for %d remote blocks", ErrMismatch, len(localBlocks), len(remoteBlocks))
	}
	ld, err := local.blockSlices(localBlocks, hs.Local, hs.Count)
	if err != nil {
		return DescList{}, DescList{}, err
	}
	rd, err := remote.blockSlices(remoteBlocks, hs.Remote, hs.Count)
	if err != nil {
		return DescList{}, DescList{}, err
	}
	return ld, rd, nil
}

// SliceLists returns the descriptor lists of every (layer, block, plane) of
// both layouts restricted to the heads they share, in DescIndex order, to be
// prepared once with Agent.PrepDescList and addressed with AppendIndices.
// Errors wrap ErrMismatch.
func SliceLists(local, remote *Layout) (DescList, DescList, error) {
	hs, err := headSlice(local, remote)
	if err != nil {
		return DescList{}, DescList{}, err
	}
	return local.sliceList(hs.Local, hs.Count), remote.sliceList(hs.Remote, hs.Count), nil
}

// headSlice checks compatibility and returns the shared heads.
func headSlice(local, remote *Layout) (HeadSlice, error) {
	if err := Compatible(local, remote); err != nil {
		return HeadSlice{}, err
	}
	hs, ok := Overlap(local, remote)
	if !ok {
		return HeadSlice{}, fmt.Errorf("%w: local rank %d/%d and remote rank %d/%d share no kv heads",
			ErrMismatch, local.TPRank, local.tpSize(), remote.TPRank, remote.tpSize())
	}
	return hs, nil
}
