package kvroute

import (
	"cmp"
	"encoding/binary"
	"slices"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// MMObject is one multimodal item of a prompt (an image, a video, an audio
// clip): its hash and the placeholder tokens it occupies. Blocks whose
// tokens overlap [Offset, Offset+Length) include Hash in their block hash,
// so that prompts whose placeholder tokens are equal but whose items differ
// never share blocks.
type MMObject struct {
	// Hash identifies the item; see MMIdentifierHash for the engines'
	// identifiers.
	Hash uint64
	// Offset is the index of the item's first placeholder token in the
	// prompt.
	Offset int
	// Length is the number of placeholder tokens.
	Length int
}

// MMIdentifierHash maps an engine's multimodal identifier (vLLM's
// mm_feature.identifier) to the 64-bit hash blocks are hashed with, as
// Dynamo does: a 64-digit hex digest gives its first 16 hex digits read as
// an integer; any other non-empty identifier gives XXH3-64(identifier,
// seed 0). It returns false for an empty identifier.
func MMIdentifierHash(id string) (uint64, bool) {
	if id == "" {
		return 0, false
	}
	if len(id) == 64 && isHex(id) {
		var v uint64
		for i := range 16 {
			v = v<<4 | uint64(hexValue(id[i]))
		}
		return v, true
	}
	return xxh3.HashString(id), true
}

func hexValue(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// maxStackMM and maxStackBlockBytes bound the scratch space the
// multimodal hashing keeps on the stack; more items, or larger blocks,
// allocate.
const (
	maxStackMM         = 8
	maxStackBlockBytes = 320
)

// HashBlockMM returns the hash of one block of token ids (WindowTokens of
// them) that holds the multimodal items whose hashes are mm, bit-identical
// to Dynamo's compute_block_hash_for_seq with block_mm_infos: XXH3-64 over
// the tokens as little-endian uint32 values followed by the sorted item
// hashes as little-endian uint64 values. With no item it equals HashBlock.
// The order of mm does not matter and mm is not modified.
func (h Hasher) HashBlockMM(tokens []uint32, mm []uint64) BlockHash {
	if len(mm) == 0 {
		return h.HashBlock(tokens)
	}
	var sbuf [maxStackMM]uint64
	return h.hashMM(tokens, append(sbuf[:0], mm...))
}

// hashMM is HashBlockMM for a non-empty mm that it may reorder.
func (h Hasher) hashMM(tokens []uint32, mm []uint64) BlockHash {
	slices.Sort(mm)
	var bbuf [maxStackBlockBytes]byte
	b := bbuf[:0]
	if n := len(tokens)*4 + len(mm)*8; n > len(bbuf) {
		b = make([]byte, 0, n)
	}
	b = append(b, tokenBytes(tokens)...)
	for _, x := range mm {
		b = binary.LittleEndian.AppendUint64(b, x)
	}
	return BlockHash(xxh3.HashSeed(b, h.seed))
}

// AppendHashesMM is AppendHashes for a prompt with multimodal items: block
// i (the stride tokens [i*BlockSize, (i+1)*BlockSize), whatever the Eagle
// window) includes the hashes of the items that overlap it, as vLLM lists
// them in its per-block extra keys and Dynamo's block_mm_infos carry them.
// Items need not be sorted, and mm is not modified. With no item it equals
// AppendHashes.
//
// Give one item per multimodal input of the engine (vLLM's mm_features),
// covering its whole placeholder range. A block counts every item that
// overlaps it, so the same image twice within one block counts twice, as
// vLLM's extra keys (and the block_mm_infos Dynamo reads from them for KV
// events) list it. Dynamo's request side (RequestExtraInfo.to_block_level)
// lists a hash once per block instead, so that for such a block its request
// hashes differ from its own event hashes; kvroute hashes as the events do.
//
// Its cost is that of the blocks plus the blocks each item covers, so that
// a prompt with many items (video frames, say) hashes in about the time of
// one with few; items not sorted by offset cost a sorted copy when there
// are more than eight.
func (h Hasher) AppendHashesMM(blocks []BlockHash, seqs []SeqHash, tokens []uint32, mm []MMObject) ([]BlockHash, []SeqHash) {
	if len(mm) == 0 {
		return h.AppendHashes(blocks, seqs, tokens)
	}
	return h.appendMM(blocks, seqs, tokens, mm, true)
}

// AppendSeqHashesMM is AppendSeqHashes for a prompt with multimodal items
// (see AppendHashesMM). With no item it is AppendSeqHashes.
func (h Hasher) AppendSeqHashesMM(dst []SeqHash, tokens []uint32, mm []MMObject) []SeqHash {
	if len(mm) == 0 {
		return h.AppendSeqHashes(dst, tokens)
	}
	_, dst = h.appendMM(nil, dst, tokens, mm, false)
	return dst
}

// byOffset orders items by their first placeholder token.
func byOffset(a, b MMObject) int { return cmp.Compare(a.Offset, b.Offset) }

// reaches reports whether item o covers a token at or after pos, that is
// pos < Offset+Length, computed without the sum (which may overflow).
func (o MMObject) reaches(pos int) bool {
	return o.Length > 0 && (o.Offset >= pos || uint(pos)-uint(o.Offset) < uint(o.Length))
}

// appendMM sweeps the blocks and the items in order of offset together:
// items join the active set when the sweep reaches their offset and leave
// it after their last block, so that each block looks only at the items
// that overlap it (or ended in the block before).
func (h Hasher) appendMM(blocks []BlockHash, seqs []SeqHash, tokens []uint32, mm []MMObject, keepBlocks bool) ([]BlockHash, []SeqHash) {
	n := h.Blocks(len(tokens))
	if n == 0 {
		return blocks, seqs
	}
	items := mm
	var ibuf [maxStackMM]MMObject
	if !slices.IsSortedFunc(mm, byOffset) {
		if len(mm) <= len(ibuf) {
			items = append(ibuf[:0], mm...)
		} else {
			items = slices.Clone(mm)
		}
		slices.SortFunc(items, byOffset)
	}
	raw, bs := tokenBytes(tokens), h.blockSize
	fast, k, p := h.fast64(), seededKeys64(h.seed), unsafe.Pointer(unsafe.SliceData(raw))
	var abuf [maxStackMM]MMObject
	var hbuf [maxStackMM]uint64
	active, next := abuf[:0], 0
	var prev SeqHash
	for i := range n {
		start, end := i*bs, (i+1)*bs
		kept := active[:0]
		for _, o := range active {
			if o.reaches(start) {
				kept = append(kept, o)
			}
		}
		active = kept
		for ; next < len(items) && items[next].Offset < end; next++ {
			if items[next].reaches(start) {
				active = append(active, items[next])
			}
		}
		var local BlockHash
		switch {
		case len(active) > 0:
			in := hbuf[:0]
			for _, o := range active {
				in = append(in, o.Hash)
			}
			local = h.hashMM(tokens[start:start+h.window/4], in)
		case fast: // n blocks of 64 bytes lie inside raw: n = len(tokens)/16
			local = BlockHash(hash64(unsafe.Add(p, start*4), &k))
		default:
			local = BlockHash(xxh3.HashSeed(raw[start*4:start*4+h.window], h.seed))
		}
		if i == 0 {
			prev = SeqHash(local)
		} else {
			prev = NextSeqHash(prev, local)
		}
		if keepBlocks {
			blocks = append(blocks, local)
		}
		seqs = append(seqs, prev)
	}
	return blocks, seqs
}
