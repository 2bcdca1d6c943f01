package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"unsafe"

	"github.com/tinylib/msgp/msgp"
	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute"
)

// DynamoSaltPrefix tags the cache salts Dynamo's vLLM worker passes to
// vLLM, which then appear in extra_keys.
const DynamoSaltPrefix = "dynamo-cache-salt:"

// ExtraKeys is what a BlockStored event's extra_keys say about its blocks'
// identity, read by ParseExtraKeys.
type ExtraKeys struct {
	// Salt is the cache salt of the first block, empty when none.
	Salt string
	// MM holds, per block, the hashes of the multimodal items (and prompt
	// embedding digests) the block includes; nil for a block without.
	MM [][]uint64

	last string // the last salt read, reused while it repeats
}

// ParseExtraKeys reads vLLM's extra_keys (the raw msgpack of
// EngineEvent.ExtraKeys: one entry per block, nil or an array of keys) into
// x, reusing its slices. lora is the event's LoRA name; root reports that
// the event has no parent, so that its first block is the first block of
// the request, the only block vLLM gives the cache salt (vLLM's
// vllm/v1/core/block_pool.py passes start_token_idx 0, the salt's
// condition, only for an event whose parent_block_hash is None).
//
// vLLM writes each block's keys untagged (vllm/v1/core/kv_cache_utils.py
// generate_block_hash_extra_keys; from 0.33 to_event_extra_keys untags
// them), in this order: the LoRA name (when the request has an adapter),
// the block's multimodal items, the cache salt (first block only) and
// prompt embedding digests as byte strings. The items are
// [identifier, offset] pairs from 0.19 on, bare identifier strings before
// (_gen_mm_extra_hash_keys); an identifier is the item's hash (a hex
// digest, "<lora>:"-prefixed with tower-connector LoRA) or the request's
// own multimodal UUID. The rules:
//   - the first bare string equal to lora is the LoRA name and is skipped;
//   - an [identifier, offset] pair is a multimodal item, hashed with
//     kvroute.MMIdentifierHash;
//   - in a root event's first block, the last other bare string is the
//     place of the cache salt, and the bare strings before it are
//     multimodal identifiers (vLLM before 0.19). It is the salt when the
//     event has pairs (the layout of 0.19 on, whose only other bare string
//     is the salt), or when it is tagged by Dynamo's vLLM worker
//     ("dynamo-cache-salt:", untagged so that it equals the salt Dynamo's
//     frontend hashes requests with), or else when it is not a multimodal
//     identifier of vLLM before 0.19: not a hash (64 or 128 hex digits,
//     after an optional "<lora>:") and not listed again by a later block
//     (an item running into the next block). A request's own UUID of an
//     item that ends in the first block of such an event, with no salt
//     after it, cannot be told from a salt and is read as one;
//   - other bare strings (of later blocks, or of an event with a parent)
//     are multimodal identifiers of vLLM before 0.19;
//   - a byte string (a prompt embedding digest) counts as an item with
//     hash XXH3-64 of its bytes, so blocks of different embeddings differ;
//   - numbers and booleans are ignored.
//
// It returns an error wrapping ErrMalformed when extra_keys is not a list
// of nil or arrays.
func ParseExtraKeys(raw []byte, lora string, root bool, x *ExtraKeys) error {
	x.Salt = ""
	sc := extraKeysScan{root: root}
	err := x.readPerBlock(raw, "extra_keys", func(p []byte, blk int) ([]byte, error) {
		m, p, err := readArrayHeader(p, 1)
		if err != nil {
			return p, err
		}
		loraSeen := lora == ""
		for range m {
			if p, err = x.readExtraKey(p, blk, lora, &loraSeen, &sc); err != nil {
				return p, err
			}
		}
		return p, nil
	})
	if err != nil || sc.salt == nil {
		return err
	}
	s := sc.salt
	if !bytes.HasPrefix(s, []byte(DynamoSaltPrefix)) && !sc.pairs && (sc.again || isMMHashID(s)) {
		addMM(&x.MM[0], s)
		return nil
	}
	s = bytes.TrimPrefix(s, []byte(DynamoSaltPrefix))
	if string(s) != x.last {
		x.last = string(s)
	}
	x.Salt = x.last
	return nil
}

// extraKeysScan is what ParseExtraKeys learns of an event's extra_keys
// while it reads them.
type extraKeysScan struct {
	root  bool   // the event has no parent
	salt  []byte // the bare string at the salt's place, nil when none
	again bool   // a later block lists salt as well
	pairs bool   // some block has an [identifier, offset] pair
}

// isMMHashID reports whether a bare extra key has the form of vLLM's
// multimodal hashes: the hex digest of MultiModalHasher (64 digits for
// blake3 or sha256, 128 for sha512), after an optional "<lora>:" prefix.
func isMMHashID(s []byte) bool {
	if i := bytes.LastIndexByte(s, ':'); i >= 0 {
		s = s[i+1:]
	}
	return (len(s) == 64 || len(s) == 128) && isHexDigest(s)
}

// readPerBlock empties x.MM and reads raw, a msgpack list with one entry
// per block (named what in errors), giving each block a slot in x.MM:
// nil entries leave it empty, others are read by entry, which returns
// what follows the entry.
func (x *ExtraKeys) readPerBlock(raw []byte, what string, entry func(p []byte, blk int) ([]byte, error)) error {
	for i := range x.MM {
		x.MM[i] = x.MM[i][:0]
	}
	x.MM = x.MM[:0]
	if len(raw) == 0 || msgp.IsNil(raw) {
		return nil
	}
	n, p, err := readArrayHeader(raw, 1)
	if err != nil {
		return malformed(what, err)
	}
	for blk := range int(n) {
		x.MM = growMM(x.MM)
		if msgp.IsNil(p) {
			p = p[1:]
			continue
		}
		if p, err = entry(p, blk); err != nil {
			return malformed(fmt.Sprintf("%s[%d]", what, blk), err)
		}
	}
	if len(p) != 0 {
		return fmt.Errorf("%w: %d bytes after %s", ErrMalformed, len(p), what)
	}
	return nil
}

// ParseBlockMMInfos reads block_mm_infos (the raw msgpack of
// EngineEvent.BlockMMInfos: one entry per block, nil or a map whose
// "mm_objects" lists maps with an unsigned "mm_hash") into x.MM, one entry
// per block holding its objects' mm_hash values in order, as Dynamo hashes
// them; other keys (offsets) are skipped. x.Salt is left as it is.
//
// It returns an error wrapping ErrMalformed when block_mm_infos is not of
// that shape or an mm_hash is not an unsigned 64-bit integer.
func ParseBlockMMInfos(raw []byte, x *ExtraKeys) error {
	return x.readPerBlock(raw, "block_mm_infos", func(p []byte, _ int) ([]byte, error) {
		return readBlockMMInfo(p, &x.MM[len(x.MM)-1])
	})
}

// readBlockMMInfo appends the mm_hash values of one block's
// {"mm_objects": [...]} map to cur.
func readBlockMMInfo(p []byte, cur *[]uint64) ([]byte, error) {
	n, p, err := msgp.ReadMapHeaderBytes(p)
	if err != nil {
		return p, err
	}
	for range n {
		var key []byte
		if key, p, err = msgp.ReadStringZC(p); err != nil {
			return p, err
		}
		if string(key) != "mm_objects" || msgp.IsNil(p) {
			if p, err = msgp.Skip(p); err != nil {
				return p, err
			}
			continue
		}
		var m uint32
		if m, p, err = readArrayHeader(p, 1); err != nil {
			return p, err
		}
		for range m {
			var k uint32
			if k, p, err = msgp.ReadMapHeaderBytes(p); err != nil {
				return p, err
			}
			for range k {
				if key, p, err = msgp.ReadStringZC(p); err != nil {
					return p, err
				}
				if string(key) != "mm_hash" {
					if p, err = msgp.Skip(p); err != nil {
						return p, err
					}
					continue
				}
				var h uint64
				if h, p, err = msgp.ReadUint64Bytes(p); err != nil {
					return p, fmt.Errorf("mm_hash: %w", err)
				}
				*cur = append(*cur, h)
			}
		}
	}
	return p, nil
}

func growMM(mm [][]uint64) [][]uint64 {
	if len(mm) < cap(mm) {
		mm = mm[:len(mm)+1]
		mm[len(mm)-1] = mm[len(mm)-1][:0]
		return mm
	}
	return append(mm, nil)
}

func (x *ExtraKeys) readExtraKey(p []byte, blk int, lora string, loraSeen *bool, sc *extraKeysScan) ([]byte, error) {
	cur := &x.MM[len(x.MM)-1]
	switch msgp.NextType(p) {
	case msgp.StrType:
		s, rest, err := msgp.ReadStringZC(p)
		if err != nil {
			return rest, err
		}
		switch {
		case !*loraSeen && string(s) == lora:
			*loraSeen = true
		case sc.root && blk == 0:
			// The salt's place is the last bare string: one before it is
			// a multimodal identifier.
			addMM(cur, sc.salt)
			sc.salt = s
		default:
			sc.again = sc.again || sc.salt != nil && bytes.Equal(s, sc.salt)
			addMM(cur, s)
		}
		return rest, nil
	case msgp.ArrayType:
		m, rest, err := msgp.ReadArrayHeaderBytes(p)
		if err != nil {
			return rest, err
		}
		if m == 0 {
			return rest, errors.New("empty extra key")
		}
		if msgp.NextType(rest) != msgp.StrType {
			// Not a multimodal pair: skip it whole.
			return msgp.Skip(p)
		}
		id, rest, err := msgp.ReadStringZC(rest)
		if err != nil {
			return rest, err
		}
		sc.pairs = true
		addMM(cur, id)
		for range m - 1 {
			if rest, err = msgp.Skip(rest); err != nil {
				return rest, err
			}
		}
		return rest, nil
	case msgp.BinType:
		b, rest, err := msgp.ReadBytesZC(p)
		if err != nil {
			return rest, err
		}
		*cur = append(*cur, xxh3.Hash(b))
		return rest, nil
	}
	return msgp.Skip(p)
}

func addMM(cur *[]uint64, id []byte) {
	if len(id) == 0 {
		return
	}
	// The identifier is only read during the call.
	if h, ok := kvroute.MMIdentifierHash(unsafe.String(&id[0], len(id))); ok {
		*cur = append(*cur, h)
	}
}

func isHexDigest(s []byte) bool {
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}
