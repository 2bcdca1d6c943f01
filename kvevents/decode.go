package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/tinylib/msgp/msgp"
)

// ErrMalformed is wrapped by every decoding error: the payload is not a
// well-formed batch or event. The payload should be dropped (and, on a
// sequenced transport, counted as lost).
var ErrMalformed = errors.New("kvevents: malformed payload")

// maxIntern bounds the strings a Batch keeps to avoid re-allocating
// repeated values (media, LoRA names, spec kinds, salts, session ids):
// the set is emptied when it reaches the bound, so that values seen once
// (a session id per request) do not keep later ones out for good.
// maxInternLen bounds their length.
const (
	maxIntern    = 256
	maxInternLen = 64
)

// field names an event field, for both layouts.
type field uint8

const (
	fUnknown field = iota
	fBlockHashes
	fParent
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
	fLocality
	fOwnership
	fSessionID
	fCacheSalt
	fLookahead
	fBlockMMInfos
)

// storedArrayFields and removedArrayFields give the array layouts' field
// order after the tag (vLLM's declaration order): the fixed fields, then
// the metadata tail (see metadataTail), whose source_kind (fUnknown) is
// not kept and is written as nil.
var (
	storedArrayFields = [StoredFieldsMax]field{
		fBlockHashes, fParent, fTokenIDs, fBlockSize, fLoRAID, fMedium,
		fLoRAName, fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow,
		fLocality, fUnknown,
	}
	removedArrayFields = [RemovedFieldsMax]field{
		fBlockHashes, fMedium, fGroupIdx, fSpecKind, fSlidingWindow,
		fLocality, fUnknown,
	}
	clearedArrayFields = [...]field{fUnknown} // source_kind
)

func fieldByName(name []byte) field {
	switch string(name) {
	case "block_hashes":
		return fBlockHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokenIDs
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoRAID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoRAName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroupIdx
	case "kv_cache_spec_kind":
		return fSpecKind
	case "kv_cache_spec_sliding_window":
		return fSlidingWindow
	case "locality":
		return fLocality
	case "ownership":
		return fOwnership
	case "session_id":
		return fSessionID
	case "cache_salt":
		return fCacheSalt
	case "lookahead_token_ids":
		return fLookahead
	case "block_mm_infos":
		return fBlockMMInfos
	}
	return fUnknown
}

func eventTypeByTag(tag []byte) EventType {
	switch string(tag) {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return 0
}

// DecodeBatch decodes one vLLM or SGLang KV event batch (the payload frame
// of a ZMQ message) into b, replacing its contents and reusing its buffers.
//
// It accepts every layout those engines have used: batches of two or three
// (or more) elements, events as msgspec arrays (of any length: shorter
// arrays from older producers, extra trailing fields from newer ones are
// skipped) or as tagged maps (unknown keys are skipped), hashes as
// unsigned or signed integers or byte strings. The metadata after an
// array BlockStored's extra_keys, or an array BlockRemoved's medium, is
// read as Dynamo reads it: group_idx, kv_cache_spec_kind,
// kv_cache_spec_sliding_window, locality and source_kind (not kept) while
// the values' types fit that order, then by type (an integer is the group,
// then the sliding window; a string the kind; a list, in a store,
// block_mm_infos), as earlier producers appended it. Events of unknown
// types are skipped and counted in b.Skipped, whatever their fields hold
// and wherever their tag is. An event of a known type that is
// well-formed msgpack but has an unusable field (of the wrong type or out
// of range, such as a token id above 2^32-1) is skipped and counted in
// b.Invalid, its error kept in b.InvalidErr: the other events of the batch
// still decode.
//
// Errors wrap ErrMalformed: the payload is not well-formed msgpack, or not
// a batch of tagged events. The decoded slices alias b and payload; see
// [EngineEvent]. DecodeBatch never panics, and allocates at most in
// proportion to len(payload).
func DecodeBatch(payload []byte, b *Batch) error {
	b.Reset()
	n, rest, err := msgp.ReadArrayHeaderBytes(payload)
	if err != nil {
		return malformed("batch", err)
	}
	if n < 2 {
		return fmt.Errorf("%w: batch has %d elements, want at least 2", ErrMalformed, n)
	}
	if b.Timestamp, rest, err = readFloat(rest); err != nil {
		return malformed("timestamp", err)
	}
	ne, rest, err := msgp.ReadArrayHeaderBytes(rest)
	if err != nil {
		return malformed("events", err)
	}
	// An event takes at least a 1-byte header and a 1-byte tag or key.
	if int64(ne)*2 > int64(len(rest)) {
		return fmt.Errorf("%w: %d events in %d bytes", ErrMalformed, ne, len(rest))
	}
	b.Events = growEvents(b.Events, int(ne))
	for i := range int(ne) {
		var ev EngineEvent
		var sp span
		var known bool
		start, h0, t0 := rest, len(b.hashes), len(b.tokens)
		rest, known, err = decodeEvent(rest, b, &ev, &sp)
		if err != nil {
			// An event with a readable tag is skipped alone when it is
			// whole msgpack, so that the events around it still decode: of
			// a known type, it has an unusable field; of an unknown type,
			// its fields (or keys) are not of the types of ours, or its tag
			// follows them. Anything else is not a batch of tagged events.
			end, serr := msgp.Skip(start)
			typ, tagged := taggedType(start)
			if serr != nil || !tagged {
				return fmt.Errorf("event %d: %w", i, err)
			}
			b.hashes, b.tokens = b.hashes[:h0], b.tokens[:t0]
			rest = end
			if typ == 0 {
				b.Skipped++
				continue
			}
			if b.Invalid == 0 {
				b.InvalidErr = fmt.Errorf("event %d: %w", i, err)
			}
			b.Invalid++
			continue
		}
		if !known {
			b.Skipped++
			continue
		}
		b.Events = append(b.Events, ev)
		b.spans = append(b.spans, sp)
	}
	if n >= 3 {
		b.RankSlot = true
		if msgp.IsNil(rest) {
			rest = rest[1:]
		} else {
			var r int64
			if r, rest, err = readInt(rest); err != nil {
				return malformed("data_parallel_rank", err)
			}
			b.DPRank = Some(r)
		}
		for range n - 3 {
			if rest, err = msgp.Skip(rest); err != nil {
				return malformed("trailing batch element", err)
			}
		}
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: %d trailing bytes after the batch", ErrMalformed, len(rest))
	}
	for i, sp := range b.spans {
		ev := &b.Events[i]
		if sp.h1 > sp.h0 {
			ev.BlockHashes = b.hashes[sp.h0:sp.h1:sp.h1]
		}
		if sp.t1 > sp.t0 {
			ev.TokenIDs = b.tokens[sp.t0:sp.t1:sp.t1]
		}
	}
	return nil
}

// maxEventPrealloc bounds the events preallocated from a batch's declared
// count, so a hostile header cannot make the decoder allocate far more than
// the payload holds; larger batches grow by append as they decode.
const maxEventPrealloc = 1024

func growEvents(s []EngineEvent, n int) []EngineEvent {
	if n = min(n, maxEventPrealloc); cap(s) < n {
		return make([]EngineEvent, 0, n)
	}
	return s[:0]
}

func malformed(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrMalformed, what, err)
}

// taggedType returns the type of the event at the start of p as its tag
// gives it (the first element of an array, the "type" value of a map; 0
// for an unknown tag), and whether the tag could be read. A map's keys
// that are not strings are skipped.
func taggedType(p []byte) (EventType, bool) {
	switch msgp.NextType(p) {
	case msgp.ArrayType:
		n, p, err := msgp.ReadArrayHeaderBytes(p)
		if err != nil || n == 0 {
			return 0, false
		}
		tag, _, err := msgp.ReadStringZC(p)
		if err != nil {
			return 0, false
		}
		return eventTypeByTag(tag), true
	case msgp.MapType:
		n, p, err := msgp.ReadMapHeaderBytes(p)
		if err != nil {
			return 0, false
		}
		for range n {
			var key []byte
			if msgp.NextType(p) == msgp.StrType {
				key, p, err = msgp.ReadStringZC(p)
			} else {
				p, err = msgp.Skip(p)
			}
			if err != nil {
				return 0, false
			}
			if string(key) == "type" {
				tag, _, err := msgp.ReadStringZC(p)
				if err != nil {
					return 0, false
				}
				return eventTypeByTag(tag), true
			}
			if p, err = msgp.Skip(p); err != nil {
				return 0, false
			}
		}
	}
	return 0, false
}

// decodeEvent decodes one event in either layout. known is false for an
// event of an unknown type, which has been skipped.
func decodeEvent(p []byte, b *Batch, ev *EngineEvent, sp *span) (rest []byte, known bool, err error) {
	switch msgp.NextType(p) {
	case msgp.ArrayType:
		return decodeArrayEvent(p, b, ev, sp)
	case msgp.MapType:
		return decodeMapEvent(p, b, ev, sp)
	}
	return p, false, fmt.Errorf("%w: event is neither an array nor a map", ErrMalformed)
}

func decodeArrayEvent(p []byte, b *Batch, ev *EngineEvent, sp *span) ([]byte, bool, error) {
	n, p, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil {
		return p, false, malformed("event", err)
	}
	if n == 0 {
		return p, false, fmt.Errorf("%w: empty event array", ErrMalformed)
	}
	tag, p, err := msgp.ReadStringZC(p)
	if err != nil {
		return p, false, malformed("event tag", err)
	}
	ev.Type = eventTypeByTag(tag)
	ev.Layout = LayoutArray
	ev.Fields = int(n - 1)
	var prefix []field
	switch ev.Type {
	case BlockStored:
		prefix = storedArrayFields[:storedArrayPrefix]
	case BlockRemoved:
		prefix = removedArrayFields[:removedArrayPrefix]
	}
	left := int(n - 1)
	for _, f := range prefix[:min(len(prefix), left)] {
		if p, err = readField(p, f, b, ev, sp); err != nil {
			return p, false, err
		}
	}
	left -= min(len(prefix), left)
	if prefix != nil && left > 0 {
		tail := min(left, len(metadataTail))
		if p, err = readMetadataTail(p, tail, b, ev); err != nil {
			return p, false, err
		}
		left -= tail
	}
	for range left {
		if p, err = msgp.Skip(p); err != nil {
			return p, false, malformed("trailing event field", err)
		}
	}
	return p, ev.Type != 0, nil
}

// The array layouts' fixed fields, before the metadata tail: BlockStored
// up to extra_keys, BlockRemoved up to medium.
const (
	storedArrayPrefix  = 8
	removedArrayPrefix = 2
)

// metadataTail is the metadata after the fixed fields of an array-layout
// event, in the order producers write it (Dynamo's "fixed trailing
// layout"): group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window,
// locality, source_kind (the last is not kept). Each value's msgpack type
// class is an integer (msgp.IntType) or a string; nil fits any.
var metadataTail = [...]struct {
	f   field
	typ msgp.Type
}{
	{fGroupIdx, msgp.IntType}, {fSpecKind, msgp.StrType}, {fSlidingWindow, msgp.IntType},
	{fLocality, msgp.StrType}, {fUnknown, msgp.StrType},
}

// readMetadataTail reads the n values of an array-layout event's metadata
// tail (n at most len(metadataTail)). Values are read in metadataTail's
// order while their types fit it; from the first that does not, by type,
// as Dynamo reads the tuples of producers that appended them
// opportunistically: an integer is group_idx, then
// kv_cache_spec_sliding_window; a string is kv_cache_spec_kind; a list,
// in a BlockStored, is block_mm_infos; other values are skipped.
func readMetadataTail(p []byte, n int, b *Batch, ev *EngineEvent) ([]byte, error) {
	var err error
	inOrder := true
	for i := range n {
		t := msgp.NextType(p)
		if t == msgp.UintType {
			t = msgp.IntType
		}
		f := fUnknown
		switch {
		case inOrder && (t == msgp.NilType || t == metadataTail[i].typ):
			f = metadataTail[i].f
		case t == msgp.IntType:
			inOrder = false
			if f = fGroupIdx; ev.GroupIdx.Valid {
				if f = fSlidingWindow; ev.SlidingWindow.Valid {
					f = fUnknown
				}
			}
		case t == msgp.StrType:
			inOrder, f = false, fSpecKind
		case t == msgp.ArrayType && ev.Type == BlockStored:
			inOrder, f = false, fBlockMMInfos
		default:
			inOrder = false
		}
		if f == fUnknown {
			if p, err = msgp.Skip(p); err != nil {
				return p, malformed("trailing event field", err)
			}
			continue
		}
		if p, err = readField(p, f, b, ev, nil); err != nil {
			return p, err
		}
	}
	return p, nil
}

func decodeMapEvent(p []byte, b *Batch, ev *EngineEvent, sp *span) ([]byte, bool, error) {
	wide := len(p) > 0 && p[0] == 0xde
	n, p, err := msgp.ReadMapHeaderBytes(p)
	if err != nil {
		return p, false, malformed("event", err)
	}
	if int64(n)*2 > int64(len(p)) {
		return p, false, fmt.Errorf("%w: %d map entries in %d bytes", ErrMalformed, n, len(p))
	}
	ev.Layout = LayoutMap
	ev.WideMap = wide && n < 16
	sawType := false
	for range n {
		var key []byte
		if key, p, err = msgp.ReadStringZC(p); err != nil {
			return p, false, malformed("event key", err)
		}
		if string(key) == "type" {
			var tag []byte
			if tag, p, err = msgp.ReadStringZC(p); err != nil {
				return p, false, malformed("event tag", err)
			}
			ev.Type, sawType = eventTypeByTag(tag), true
			continue
		}
		f := fieldByName(key)
		if f == fUnknown || sawType && ev.Type == 0 {
			// An unknown key, or any key of an event of an unknown type
			// (whose fields need not be of the types ours have).
			if p, err = msgp.Skip(p); err != nil {
				return p, false, malformed("unknown event field", err)
			}
			continue
		}
		if p, err = readField(p, f, b, ev, sp); err != nil {
			return p, false, err
		}
	}
	if !sawType {
		return p, false, fmt.Errorf("%w: event map without \"type\"", ErrMalformed)
	}
	return p, ev.Type != 0, nil
}

// readField reads the value of field f into ev (and the arenas of b).
func readField(p []byte, f field, b *Batch, ev *EngineEvent, sp *span) ([]byte, error) {
	var err error
	switch f {
	case fBlockHashes:
		sp.h0 = len(b.hashes)
		p, err = readHashes(p, b)
		sp.h1 = len(b.hashes)
		if err != nil {
			return p, malformed("block_hashes", err)
		}
		return p, nil
	case fParent:
		if msgp.IsNil(p) {
			ev.ParentBlockHash = Hash{}
			return p[1:], nil
		}
		if ev.ParentBlockHash, p, err = readHash(p); err != nil {
			return p, malformed("parent_block_hash", err)
		}
		return p, nil
	case fTokenIDs:
		sp.t0 = len(b.tokens)
		p, ev.Eagle, err = readTokens(p, b)
		sp.t1 = len(b.tokens)
		if err != nil {
			return p, malformed("token_ids", err)
		}
		return p, nil
	case fBlockSize:
		var v OptInt
		if v, p, err = readOptInt(p); err != nil {
			return p, malformed("block_size", err)
		}
		if v.Value < 0 || v.Value > math.MaxInt32 {
			return p, fmt.Errorf("%w: block_size %d out of range", ErrMalformed, v.Value)
		}
		ev.BlockSize = int(v.Value)
		return p, nil
	case fLoRAID:
		ev.LoRAID, p, err = readOptInt(p)
	case fGroupIdx:
		ev.GroupIdx, p, err = readOptInt(p)
	case fSlidingWindow:
		ev.SlidingWindow, p, err = readOptInt(p)
	case fMedium:
		ev.Medium, p, err = b.readOptString(p)
	case fLoRAName:
		if ev.Layout == LayoutArray && msgp.NextType(p) == msgp.MapType {
			return readSaltMetadata(p, b, ev)
		}
		ev.LoRAName, p, err = b.readOptString(p)
	case fSpecKind:
		ev.SpecKind, p, err = b.readOptString(p)
	case fLocality:
		ev.Locality, p, err = b.readOptString(p)
	case fOwnership:
		ev.Ownership, p, err = b.readOptString(p)
	case fSessionID:
		ev.SessionID, p, err = b.readOptString(p)
	case fCacheSalt:
		ev.CacheSalt, p, err = b.readOptString(p)
	case fExtraKeys:
		ev.ExtraKeys, p, err = readRaw(p)
		if err != nil {
			return p, malformed("extra_keys", err)
		}
		return p, nil
	case fLookahead:
		ev.LookaheadTokenIDs, p, err = readRaw(p)
		if err != nil {
			return p, malformed("lookahead_token_ids", err)
		}
		return p, nil
	case fBlockMMInfos:
		ev.BlockMMInfos, p, err = readRaw(p)
		if err != nil {
			return p, malformed("block_mm_infos", err)
		}
		return p, nil
	}
	if err != nil {
		return p, malformed(fieldName(f), err)
	}
	return p, nil
}

// readSaltMetadata reads the map SGLang 0.5.18 and 0.5.19 put in an array
// BlockStored's lora_name slot (see EngineEvent.SaltMetadata): its
// "cache_salt" (a string or nil) into ev.CacheSalt; other keys are skipped,
// as Dynamo does.
func readSaltMetadata(p []byte, b *Batch, ev *EngineEvent) ([]byte, error) {
	ev.SaltMetadata = true
	return readMap(p, "lora_name slot metadata", func(key, p []byte) ([]byte, error) {
		if string(key) != "cache_salt" {
			return msgp.Skip(p)
		}
		var err error
		ev.CacheSalt, p, err = b.readOptString(p)
		return p, err
	})
}

func fieldName(f field) string {
	switch f {
	case fLoRAID:
		return "lora_id"
	case fGroupIdx:
		return "group_idx"
	case fSlidingWindow:
		return "kv_cache_spec_sliding_window"
	case fMedium:
		return "medium"
	case fLoRAName:
		return "lora_name"
	case fSpecKind:
		return "kv_cache_spec_kind"
	case fLocality:
		return "locality"
	case fOwnership:
		return "ownership"
	case fSessionID:
		return "session_id"
	case fCacheSalt:
		return "cache_salt"
	}
	return "field"
}

// readHashes appends a list of hashes (or nothing for nil) to b.hashes.
func readHashes(p []byte, b *Batch) ([]byte, error) {
	if msgp.IsNil(p) {
		return p[1:], nil
	}
	n, p, err := readArrayHeader(p, 1)
	if err != nil {
		return p, err
	}
	b.hashes = grow(b.hashes, int(n))
	start := len(b.hashes)
	hs := b.hashes[start : start+int(n)]
	for i := range hs {
		// The 64-bit forms engines send, uint64 (0xcf: vLLM, SGLang's
		// non-negative hashes) and int64 (0xd3: SGLang's negative ones),
		// decoded without a branch on which: a negative int64 is HashInt.
		if len(p) >= 9 && (p[0]-0xcf)&^4 == 0 {
			k := binary.BigEndian.Uint64(p[1:9])
			hs[i] = Hash{Kind: HashUint + HashKind(k>>63&uint64(p[0]>>4&1)), Key: k}
			p = p[9:]
			continue
		}
		if hs[i], p, err = readHash(p); err != nil {
			return p, err
		}
	}
	b.hashes = b.hashes[:start+int(n)]
	return p, nil
}

// readHash reads one block hash: an integer of any width and sign, or a
// byte string.
func readHash(p []byte) (Hash, []byte, error) {
	if len(p) == 0 {
		return Hash{}, p, msgp.ErrShortBytes
	}
	c := p[0]
	switch {
	case c <= 0x7f:
		return Hash{Kind: HashUint, Key: uint64(c)}, p[1:], nil
	case c >= 0xcc && c <= 0xcf:
		v, o, err := msgp.ReadUint64Bytes(p)
		return UintHash(v), o, err
	case c >= 0xe0 || (c >= 0xd0 && c <= 0xd3):
		v, o, err := msgp.ReadInt64Bytes(p)
		return IntHash(v), o, err
	case c >= 0xc4 && c <= 0xc6:
		v, o, err := msgp.ReadBytesZC(p)
		if err != nil {
			return Hash{}, o, err
		}
		return BytesHash(v[:len(v):len(v)]), o, nil
	}
	return Hash{}, p, fmt.Errorf("block hash of msgpack type %s", msgp.NextType(p))
}

// readRaw returns the raw msgpack of one value, or nil for nil.
func readRaw(p []byte) ([]byte, []byte, error) {
	if msgp.IsNil(p) {
		return nil, p[1:], nil
	}
	end, err := msgp.Skip(p)
	if err != nil {
		return nil, p, err
	}
	n := len(p) - len(end)
	return p[:n:n], end, nil
}

// readTokens appends a list of token ids (or nothing for nil) to b.tokens.
// A list of [t, t+1] pairs (SGLang's Eagle bigram pages) gives the first
// token of each pair followed by the second token of the last one, and
// eagle true; pairs and plain ids cannot be mixed.
func readTokens(p []byte, b *Batch) ([]byte, bool, error) {
	if msgp.IsNil(p) {
		return p[1:], false, nil
	}
	n, p, err := readArrayHeader(p, 1)
	if err != nil {
		return p, false, err
	}
	if n > 0 && msgp.NextType(p) == msgp.ArrayType {
		return readBigrams(p, b, int(n))
	}
	b.tokens = grow(b.tokens, int(n))
	start := len(b.tokens)
	ts := b.tokens[start : start+int(n)]
	i, p := readTokenRun(p, ts)
	for ; i < len(ts); i++ {
		if ts[i], p, err = readToken(p); err != nil {
			return p, false, err
		}
	}
	b.tokens = b.tokens[:start+int(n)]
	return p, false, nil
}

// readTokenRun decodes token ids into ts for as long as at least 8 bytes
// remain, and returns how many it decoded and the rest of p. It decodes
// the widths producers use for token ids (a positive fixint, uint8, uint16
// or uint32); when it meets another lead byte it returns 0 and p, and the
// caller decodes the whole list with readToken.
//
// Ids of mixed widths make a branch per width mispredict about every other
// token, and decoding is a chain (where a token starts depends on the
// width of the one before), so the loop has no branch on the data and
// keeps the chain short: for a lead byte c of a valid width, hi = c>>7 is
// 0 for a fixint and 1 for uint8, uint16, uint32, whose c&3 is 0, 1, 2 and
// which take 1<<(c&3) bytes after c, so the width is 1 + hi<<(c&3); the
// next lead byte is taken from the 8 bytes loaded for this token (a token
// takes at most 5), and the shifts that extract the value come from
// tokenShifts.
func readTokenRun(p []byte, ts []uint32) (int, []byte) {
	if len(ts) == 0 || len(p) < 8 {
		return 0, p
	}
	off, i := 0, 0
	c := uint64(p[0])
	var bad uint16
	for ; i < len(ts) && off+8 <= len(p); i++ {
		x := binary.BigEndian.Uint64(p[off : off+8])
		sh := tokenShifts[c]
		bad |= sh
		ts[i] = uint32((x << (sh & 63)) >> (sh >> 8 & 63))
		w := 1 + (c>>7)<<(c&3)
		c = (x << (w << 3 & 63)) >> 56
		off += int(w)
	}
	if bad&badToken != 0 {
		return 0, p
	}
	return i, p[off:]
}

// badToken marks the entries of tokenShifts for lead bytes readTokenRun
// does not decode.
const badToken = 0x8000

// tokenShifts holds, for the lead byte of a token id, the left shift (low
// byte) and right shift (high byte) that extract its value from the 8
// bytes starting at the lead byte, read big-endian; badToken for a lead
// byte of another type or width.
var tokenShifts = func() (t [256]uint16) {
	for c := range t {
		t[c] = badToken
	}
	for c := range 0x80 {
		t[c] = 56 << 8 // positive fixint: the lead byte itself
	}
	t[0xcc] = 8 | 56<<8 // uint8
	t[0xcd] = 8 | 48<<8 // uint16
	t[0xce] = 8 | 32<<8 // uint32
	return t
}()

// readBigrams reads n [t, t+1] pairs (after the list header).
func readBigrams(p []byte, b *Batch, n int) ([]byte, bool, error) {
	// Each pair takes at least 3 bytes.
	if int64(n)*3 > int64(len(p)) {
		return p, false, fmt.Errorf("%d token pairs in %d bytes", n, len(p))
	}
	b.tokens = grow(b.tokens, n+1)
	start := len(b.tokens)
	ts := b.tokens[start : start+n+1]
	for i := range n {
		m, rest, err := msgp.ReadArrayHeaderBytes(p)
		if err != nil {
			return rest, false, fmt.Errorf("token pair %d: %w", i, err)
		}
		if m != 2 {
			return rest, false, fmt.Errorf("token pair %d has %d elements, want 2", i, m)
		}
		if ts[i], rest, err = readToken(rest); err != nil {
			return rest, false, err
		}
		if ts[i+1], p, err = readToken(rest); err != nil {
			return p, false, err
		}
	}
	b.tokens = b.tokens[:start+n+1]
	return p, true, nil
}

// readToken reads one token id, a non-negative integer below 2^32. The
// common widths are decoded inline.
func readToken(p []byte) (uint32, []byte, error) {
	if len(p) >= 1 && p[0] <= 0x7f {
		return uint32(p[0]), p[1:], nil
	}
	if len(p) >= 3 && p[0] == 0xcd {
		return uint32(p[1])<<8 | uint32(p[2]), p[3:], nil
	}
	if len(p) >= 5 && p[0] == 0xce {
		return uint32(p[1])<<24 | uint32(p[2])<<16 | uint32(p[3])<<8 | uint32(p[4]), p[5:], nil
	}
	v, o, err := msgp.ReadUint64Bytes(p)
	if err != nil {
		return 0, o, err
	}
	if v > math.MaxUint32 {
		return 0, o, fmt.Errorf("token id %d out of range", v)
	}
	return uint32(v), o, nil
}

func grow[T any](s []T, n int) []T {
	if cap(s)-len(s) < n {
		ns := make([]T, len(s), 2*cap(s)+n)
		copy(ns, s)
		return ns
	}
	return s
}

// readInt reads a signed integer of any width (unsigned ones up to
// MaxInt64).
func readInt(p []byte) (int64, []byte, error) {
	if len(p) >= 1 && p[0] <= 0x7f {
		return int64(p[0]), p[1:], nil
	}
	return msgp.ReadInt64Bytes(p)
}

func readOptInt(p []byte) (OptInt, []byte, error) {
	if msgp.IsNil(p) {
		return OptInt{}, p[1:], nil
	}
	v, p, err := readInt(p)
	if err != nil {
		return OptInt{}, p, err
	}
	return Some(v), p, nil
}

// readFloat reads a float64, float32 or integer as a float64.
func readFloat(p []byte) (float64, []byte, error) {
	switch msgp.NextType(p) {
	case msgp.Float64Type:
		return msgp.ReadFloat64Bytes(p)
	case msgp.Float32Type:
		f, o, err := msgp.ReadFloat32Bytes(p)
		return float64(f), o, err
	case msgp.UintType:
		u, o, err := msgp.ReadUint64Bytes(p)
		return float64(u), o, err
	}
	i, o, err := msgp.ReadInt64Bytes(p)
	return float64(i), o, err
}

// readOptString reads a string or nil (as ""), interning short strings so
// that repeated values (media, LoRA names) do not allocate.
func (b *Batch) readOptString(p []byte) (string, []byte, error) {
	if msgp.IsNil(p) {
		return "", p[1:], nil
	}
	s, p, err := msgp.ReadStringZC(p)
	if err != nil {
		return "", p, err
	}
	if len(s) == 0 {
		return "", p, nil
	}
	if len(s) > maxInternLen {
		return string(s), p, nil
	}
	if v, ok := b.intern[string(s)]; ok {
		return v, p, nil
	}
	v := string(s)
	if b.intern == nil {
		b.intern = make(map[string]string)
	}
	if len(b.intern) >= maxIntern {
		clear(b.intern)
	}
	b.intern[v] = v
	return v, p, nil
}
