package kvevents_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute/kvevents"
)

// storedPrefix returns a batch holding one array-layout BlockStored event
// up to its token_ids.
func storedPrefix() []byte {
	p := msgp.AppendArrayHeader(nil, 3)
	p = msgp.AppendFloat64(p, 1757500000)
	p = msgp.AppendArrayHeader(p, 1)
	p = msgp.AppendArrayHeader(p, 7)
	p = msgp.AppendString(p, "BlockStored")
	p = msgp.AppendArrayHeader(p, 1)
	p = msgp.AppendUint64(p, 42)
	return msgp.AppendNil(p)
}

// storedWithTokens returns a batch holding one array-layout BlockStored
// event whose token_ids are the raw msgpack list, followed by the event's
// remaining fields and the batch's rank.
func storedWithTokens(list []byte) []byte {
	p := append(storedPrefix(), list...)
	p = msgp.AppendInt(p, 16)
	p = msgp.AppendNil(p)
	p = msgp.AppendString(p, "GPU")
	return msgp.AppendInt(p, 0)
}

// referenceTokens decodes a token id list the generic way, one msgp call
// per id. decoded reports that the header and every id decoded (ids below
// 2^32), exact that no byte follows the last id; eagle reports a list of
// pairs, which it does not decode. Nil is no ids.
func referenceTokens(list []byte) (ids []uint32, decoded, exact, eagle bool) {
	if msgp.IsNil(list) {
		return nil, true, len(list) == 1, false
	}
	n, p, err := msgp.ReadArrayHeaderBytes(list)
	if err != nil {
		return nil, false, false, false
	}
	if n > 0 && msgp.NextType(p) == msgp.ArrayType {
		return nil, false, false, true
	}
	for range n {
		var v uint64
		if v, p, err = msgp.ReadUint64Bytes(p); err != nil || v > math.MaxUint32 {
			return nil, false, false, false
		}
		ids = append(ids, uint32(v))
	}
	return ids, true, len(p) == 0, false
}

// checkRejected fails unless the one-event batch decoded into b with
// error err was rejected: an error wrapping ErrMalformed, or the event
// skipped as invalid (with an error wrapping ErrMalformed) and no event
// left.
func checkRejected(t *testing.T, b *kvevents.Batch, err error, what string) {
	t.Helper()
	if err == nil {
		err = b.InvalidErr
		if b.Invalid != 1 || len(b.Events) != 0 {
			t.Fatalf("%s: decoded %d events, %d invalid; want the event rejected", what, len(b.Events), b.Invalid)
		}
	}
	if !errors.Is(err, kvevents.ErrMalformed) {
		t.Fatalf("%s: error %v, want ErrMalformed", what, err)
	}
}

// checkTokens decodes the batch around list and compares its token ids
// with referenceTokens: the same ids when the list is exactly a list of
// ids, the event rejected when one of its ids does not decode. (Bytes
// after the last id are read as the event's next fields.)
func checkTokens(t *testing.T, b *kvevents.Batch, list []byte) {
	t.Helper()
	want, decoded, exact, eagle := referenceTokens(list)
	err := kvevents.DecodeBatch(storedWithTokens(list), b)
	switch {
	case eagle || decoded && !exact:
		return
	case !decoded:
		checkRejected(t, b, err, fmt.Sprintf("list % x", list))
		return
	}
	if err != nil {
		t.Fatalf("list % x: %v", list, err)
	}
	got := b.Events[0].TokenIDs
	if len(got) != len(want) {
		t.Fatalf("decoded %d ids, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("id %d: got %d, want %d (list % x)", i, got[i], want[i], list)
		}
	}
}

// appendToken encodes v in one of the msgpack integer forms that hold it.
func appendToken(p []byte, v uint32, form int) []byte {
	switch form % 8 {
	case 0:
		return msgp.AppendUint32(p, v) // the smallest width, as producers send
	case 1:
		return msgp.AppendInt64(p, int64(v))
	case 2:
		return append(p, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	case 3:
		return append(p, 0xcf, 0, 0, 0, 0, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	case 4:
		return append(p, 0xd3, 0, 0, 0, 0, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	case 5:
		if v <= math.MaxUint16 {
			return append(p, 0xcd, byte(v>>8), byte(v))
		}
	case 6:
		if v <= math.MaxInt32 {
			return append(p, 0xd2, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
		}
	}
	return msgp.AppendUint32(p, v)
}

// TestDecodeTokenIDs: token ids in every width and integer form, mixed,
// with lists of every length around the fast path's 8-byte window, decode
// to the values a generic msgpack reader gives; ids out of range, of other
// types or cut short give an error wrapping ErrMalformed.
func TestDecodeTokenIDs(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	values := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			switch rng.IntN(5) {
			case 0:
				out[i] = rng.Uint32N(128)
			case 1:
				out[i] = rng.Uint32N(256)
			case 2:
				out[i] = rng.Uint32N(65536)
			case 3:
				out[i] = rng.Uint32N(128256)
			default:
				out[i] = rng.Uint32()
			}
		}
		return out
	}
	var b kvevents.Batch
	tests := []struct {
		name  string
		forms func(i int) int // the encoding of the i-th id
	}{
		{"smallest width", func(int) int { return 0 }},
		{"signed", func(int) int { return 1 }},
		{"uint32", func(int) int { return 2 }},
		{"uint64", func(int) int { return 3 }},
		{"one uint64 among smallest", func(i int) int { return map[bool]int{true: 3}[i == 5] }},
		{"mixed", func(int) int { return rng.IntN(8) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for n := range 40 {
				vs := values(n)
				list := msgp.AppendArrayHeader(nil, uint32(n))
				for i, v := range vs {
					list = appendToken(list, v, tt.forms(i))
				}
				checkTokens(t, &b, list)
				for cut := range len(list) {
					// A payload that ends inside the list is malformed.
					err := kvevents.DecodeBatch(append(storedPrefix(), list[:cut]...), &b)
					if !errors.Is(err, kvevents.ErrMalformed) {
						t.Fatalf("%d ids cut at byte %d: error %v, want ErrMalformed", n, cut, err)
					}
				}
			}
		})
	}
	bad := []struct {
		name string
		id   []byte
	}{
		{"negative fixint", []byte{0xff}},
		{"negative int8", []byte{0xd0, 0x80}},
		{"above 2^32", []byte{0xcf, 0, 0, 0, 1, 0, 0, 0, 0}},
		{"float", []byte{0xca, 0x3f, 0x80, 0, 0}},
		{"string", []byte{0xa1, 'x'}},
		{"nil", []byte{0xc0}},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			for at := range 12 {
				list := msgp.AppendArrayHeader(nil, 12)
				for i := range 12 {
					if i == at {
						list = append(list, tt.id...)
						continue
					}
					list = msgp.AppendUint32(list, 70000+uint32(i))
				}
				err := kvevents.DecodeBatch(storedWithTokens(list), &b)
				checkRejected(t, &b, err, fmt.Sprintf("id %d %s", at, tt.name))
			}
		})
	}
}

// FuzzTokenIDs: a token_ids list of arbitrary bytes decodes to exactly the
// ids a generic msgpack reader gives, or fails when one of them does not
// decode.
func FuzzTokenIDs(f *testing.F) {
	f.Add([]byte{0x93, 0x01, 0xcd, 0x12, 0x34, 0xce, 0x00, 0x01, 0x00, 0x00})
	f.Add([]byte{0x9a, 0x7f, 0xcc, 0x80, 0xcd, 0xff, 0xff, 0xce, 0xff, 0xff, 0xff, 0xff, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06})
	f.Add([]byte{0x94, 0xcf, 0, 0, 0, 0, 0, 0, 0, 1, 0xd3, 0, 0, 0, 0, 0, 0, 0, 2, 0x05, 0xd0, 0x7f})
	f.Add([]byte{0x92, 0x05, 0xff})
	f.Add([]byte{0xc0})
	f.Add([]byte{0x92, 0x92, 0x01, 0x02, 0x92, 0x02, 0x03})
	var b kvevents.Batch
	f.Fuzz(func(t *testing.T, list []byte) {
		checkTokens(t, &b, list)
	})
}

// TestDecodeHashForms: block hashes in every msgpack integer form and as
// byte strings, mixed in one list, decode to their Hash.
func TestDecodeHashForms(t *testing.T) {
	be := func(lead byte, v uint64) []byte {
		return append([]byte{lead}, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	tests := []struct {
		name string
		wire []byte
		want kvevents.Hash
	}{
		{"fixint", []byte{0x05}, kvevents.UintHash(5)},
		{"uint8", []byte{0xcc, 0xf0}, kvevents.UintHash(0xf0)},
		{"uint16", []byte{0xcd, 0x12, 0x34}, kvevents.UintHash(0x1234)},
		{"uint32", []byte{0xce, 0x12, 0x34, 0x56, 0x78}, kvevents.UintHash(0x12345678)},
		{"uint64", be(0xcf, 0xfedcba9876543210), kvevents.UintHash(0xfedcba9876543210)},
		{"uint64 small", be(0xcf, 7), kvevents.UintHash(7)},
		{"negative fixint", []byte{0xff}, kvevents.IntHash(-1)},
		{"int8", []byte{0xd0, 0x80}, kvevents.IntHash(-128)},
		{"int16", []byte{0xd1, 0x80, 0x00}, kvevents.IntHash(-32768)},
		{"int32", []byte{0xd2, 0x80, 0, 0, 0}, kvevents.IntHash(math.MinInt32)},
		{"int64 negative", be(0xd3, 0x8000000000000001), kvevents.IntHash(math.MinInt64 + 1)},
		{"int64 minus one", be(0xd3, math.MaxUint64), kvevents.IntHash(-1)},
		{"int64 non-negative", be(0xd3, 0x7fffffffffffffff), kvevents.UintHash(math.MaxInt64)},
		{"int64 zero", be(0xd3, 0), kvevents.UintHash(0)},
		{"bytes", []byte{0xc4, 3, 1, 2, 3}, kvevents.BytesHash([]byte{1, 2, 3})},
	}
	// One list with every form, each form also after each other form.
	var list []byte
	var want []kvevents.Hash
	for _, a := range tests {
		for _, b := range tests {
			list = append(append(list, a.wire...), b.wire...)
			want = append(want, a.want, b.want)
		}
	}
	p := msgp.AppendArrayHeader(nil, 3)
	p = msgp.AppendFloat64(p, 1757500000)
	p = msgp.AppendArrayHeader(p, 1)
	p = msgp.AppendArrayHeader(p, 2)
	p = msgp.AppendString(p, "BlockRemoved")
	p = msgp.AppendArrayHeader(p, uint32(len(want)))
	p = append(append(p, list...), 0xc0)
	var b kvevents.Batch
	if err := kvevents.DecodeBatch(p, &b); err != nil {
		t.Fatal(err)
	}
	got := b.Events[0].BlockHashes
	if len(got) != len(want) {
		t.Fatalf("decoded %d hashes, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Kind != want[i].Kind || got[i].Key != want[i].Key || string(got[i].Bytes) != string(want[i].Bytes) {
			t.Fatalf("hash %d (of the pair %s, %s): got %+v, want %+v", i, tests[i/2/len(tests)].name, tests[i/2%len(tests)].name, got[i], want[i])
		}
	}
}

// TestDecodeSkipsInvalidEventAlone: an event of a known type that is
// well-formed msgpack but has an unusable field is skipped and counted
// (Batch.Invalid, and InvalidEvents once converted) while the events
// before and after it in its batch decode and convert; an event of an
// unknown type is skipped (Batch.Skipped, UnknownTypes) whatever its
// fields and keys hold and wherever its tag is; an event without a
// readable tag makes the batch malformed.
func TestDecodeSkipsInvalidEventAlone(t *testing.T) {
	arrayStored := func(hash, parent, tokens, blockSize, medium []byte) []byte {
		p := msgp.AppendArrayHeader(nil, 7)
		p = msgp.AppendString(p, "BlockStored")
		p = append(msgp.AppendArrayHeader(p, 1), hash...)
		p = append(p, parent...)
		p = append(p, tokens...)
		p = append(p, blockSize...)
		p = msgp.AppendNil(p)
		return append(p, medium...)
	}
	tokens := msgp.AppendArrayHeader(nil, 16)
	for i := range 16 {
		tokens = msgp.AppendUint32(tokens, uint32(1000+i))
	}
	nilv, u42, gpu, bs16 := []byte{0xc0}, msgp.AppendUint64(nil, 42), msgp.AppendString(nil, "GPU"), msgp.AppendInt(nil, 16)
	mapEvent := func(kv ...any) []byte {
		p := msgp.AppendMapHeader(nil, uint32(len(kv)/2))
		for _, v := range kv {
			var err error
			if p, err = msgp.AppendIntf(p, v); err != nil {
				panic(err)
			}
		}
		return p
	}
	const (
		invalid = iota
		unknown
		malformed
	)
	tokenAbove32 := append(msgp.AppendArrayHeader(nil, 1), 0xcf, 0, 0, 0, 2, 0, 0, 0, 0)
	tests := []struct {
		name    string
		event   []byte
		outcome int // invalid, unknown or batch malformed
	}{
		{"token id above 2^32", arrayStored(u42, nilv, tokenAbove32, bs16, gpu), invalid},
		{"negative block size", arrayStored(u42, nilv, tokens, msgp.AppendInt(nil, -1), gpu), invalid},
		{"block size above 2^31", arrayStored(u42, nilv, tokens, msgp.AppendInt(nil, 1<<40), gpu), invalid},
		{"hash a string", arrayStored(msgp.AppendString(nil, "h"), nilv, tokens, bs16, gpu), invalid},
		{"parent a float", arrayStored(u42, msgp.AppendFloat64(nil, 1.5), tokens, bs16, gpu), invalid},
		{"medium an integer", arrayStored(u42, nilv, tokens, bs16, msgp.AppendInt(nil, 3)), invalid},
		{"map medium an integer", mapEvent("type", "BlockRemoved", "block_hashes", []any{1}, "medium", 3), invalid},
		{"map without type", mapEvent("block_hashes", []any{1}, "medium", "GPU"), malformed},
		{"map type an integer", mapEvent("type", 1, "block_hashes", []any{1}), malformed},
		{"array tag an integer", msgp.AppendInt(msgp.AppendArrayHeader(nil, 1), 1), malformed},
		{"empty array", msgp.AppendArrayHeader(nil, 0), malformed},
		{"nil", msgp.AppendNil(nil), malformed},
		{"integer", msgp.AppendInt(nil, 5), malformed},
		{"unknown map type with fields of other types", mapEvent("type", "BlockPromoted", "block_hashes", "all", "medium", 2, "token_ids", []any{-1}), unknown},
		{"unknown array type", msgp.AppendInt(msgp.AppendString(msgp.AppendArrayHeader(nil, 2), "BlockPromoted"), -1), unknown},
		{"map with type last", mapEvent("block_hashes", []any{1}, "medium", 3, "type", "BlockRemoved"), invalid},
		{"unknown map type last, after fields of other types", mapEvent("block_hashes", "all", "medium", 2, "type", "BlockPromoted"), unknown},
		{"unknown map type with an integer key", mapEvent("type", "BlockPromoted", 7, 7), unknown},
		{"unknown map type after an integer key", mapEvent(7, 7, "type", "BlockPromoted"), unknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := msgp.AppendArrayHeader(nil, 3)
			p = msgp.AppendFloat64(p, 1757500000)
			p = msgp.AppendArrayHeader(p, 3)
			p = append(p, arrayStored(u42, nilv, tokens, bs16, gpu)...)
			p = append(p, tt.event...)
			p = msgp.AppendString(msgp.AppendArrayHeader(p, 3), "BlockRemoved")
			p = msgp.AppendUint64(msgp.AppendArrayHeader(p, 1), 42)
			p = msgp.AppendNil(p)
			p = msgp.AppendInt(p, 2)

			var b kvevents.Batch
			err := kvevents.DecodeBatch(p, &b)
			if tt.outcome == malformed {
				if !errors.Is(err, kvevents.ErrMalformed) {
					t.Fatalf("error %v, want ErrMalformed", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("batch rejected: %v", err)
			}
			if len(b.Events) != 2 || b.Events[0].Type != kvevents.BlockStored || b.Events[1].Type != kvevents.BlockRemoved {
				t.Fatalf("decoded %d events, want the store and the removal around the bad event", len(b.Events))
			}
			if len(b.Events[0].TokenIDs) != 16 || b.Events[0].BlockHashes[0].Key != 42 || b.Events[1].BlockHashes[0].Key != 42 || b.Rank() != 2 {
				t.Fatalf("events around the bad one decoded wrong: %+v", b.Events)
			}
			wantInvalid, wantUnknown := 1, 0
			if tt.outcome == unknown {
				wantInvalid, wantUnknown = 0, 1
			}
			if b.Invalid != wantInvalid || b.Skipped != wantUnknown {
				t.Fatalf("invalid %d, unknown %d; want %d, %d", b.Invalid, b.Skipped, wantInvalid, wantUnknown)
			}
			if wantInvalid == 1 && !errors.Is(b.InvalidErr, kvevents.ErrMalformed) {
				t.Fatalf("InvalidErr %v, want ErrMalformed", b.InvalidErr)
			}

			c, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 3})
			if err != nil {
				t.Fatal(err)
			}
			evs, err := c.Convert(nil, &b)
			if err != nil || len(evs) != 2 {
				t.Fatalf("converted %d events (%v), want 2", len(evs), err)
			}
			st := c.Stats()
			if st.InvalidEvents != uint64(wantInvalid) || st.UnknownTypes != uint64(wantUnknown) || st.SkippedEvents != 1 {
				t.Fatalf("stats %+v: want %d invalid, %d of unknown types, 1 skipped", st, wantInvalid, wantUnknown)
			}
		})
	}
}

// TestDecodeInternsAfterManySessions: session ids, unique per request, do
// not crowd the values that repeat (media, KV-cache kinds, LoRA names) out
// of the strings a Batch reuses for good: after thousands of sessions,
// events with a medium, kind and LoRA name first seen then allocate about
// only their session id.
func TestDecodeInternsAfterManySessions(t *testing.T) {
	payload := func(session, medium, kind, lora string) []byte {
		p := msgp.AppendArrayHeader(nil, 3)
		p = msgp.AppendFloat64(p, 1757500000)
		p = msgp.AppendArrayHeader(p, 1)
		p = msgp.AppendMapHeader(p, 11)
		p = msgp.AppendString(msgp.AppendString(p, "type"), "BlockStored")
		p = msgp.AppendUint64(msgp.AppendArrayHeader(msgp.AppendString(p, "block_hashes"), 1), 42)
		p = msgp.AppendNil(msgp.AppendString(p, "parent_block_hash"))
		p = msgp.AppendArrayHeader(msgp.AppendString(p, "token_ids"), 4)
		for i := range 4 {
			p = msgp.AppendInt(p, i)
		}
		p = msgp.AppendInt(msgp.AppendString(p, "block_size"), 4)
		p = msgp.AppendNil(msgp.AppendString(p, "lora_id"))
		p = msgp.AppendString(msgp.AppendString(p, "medium"), medium)
		p = msgp.AppendString(msgp.AppendString(p, "lora_name"), lora)
		p = msgp.AppendInt(msgp.AppendString(p, "group_idx"), 0)
		p = msgp.AppendString(msgp.AppendString(p, "kv_cache_spec_kind"), kind)
		p = msgp.AppendString(msgp.AppendString(p, "session_id"), session)
		return msgp.AppendInt(p, 0)
	}
	var b kvevents.Batch
	for i := range 2000 {
		if err := kvevents.DecodeBatch(payload(fmt.Sprintf("session-%08d", i), "GPU", "full_attention", "adapter-a"), &b); err != nil {
			t.Fatal(err)
		}
	}
	const runs = 100
	late := make([][]byte, runs+1)
	for i := range late {
		late[i] = payload(fmt.Sprintf("late-%08d", i), "CPU", "sliding_window", "adapter-b")
	}
	n := 0
	allocs := testing.AllocsPerRun(runs, func() {
		if err := kvevents.DecodeBatch(late[n], &b); err != nil {
			t.Fatal(err)
		}
		n++
	})
	ev := b.Events[0]
	if ev.Medium != "CPU" || ev.SpecKind != "sliding_window" || ev.LoRAName != "adapter-b" || ev.SessionID == "" {
		t.Fatalf("decoded %+v", ev)
	}
	// AllocsPerRun rounds down: the repeated values interned again after
	// the set was emptied stay below one allocation per batch.
	if allocs > 1 {
		t.Fatalf("%v allocations per batch, want at most 1 (the session id)", allocs)
	}
}

// TestDecodeArrayMetadataTail: the fields after extra_keys (BlockStored)
// or medium (BlockRemoved) of array-layout events are read as Dynamo
// reads them: group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window,
// locality and source_kind in that order when their types fit it, and
// otherwise by type (an integer is the group, then the sliding window; a
// string the kind; a list, in a store, block_mm_infos), as the tuples of
// earlier producers appended them.
func TestDecodeArrayMetadataTail(t *testing.T) {
	tokens := make([]any, 4)
	for i := range tokens {
		tokens[i] = 100 + i
	}
	mmInfos := []any{map[string]any{"mm_objects": []any{map[string]any{"mm_hash": uint64(7), "offsets": []any{}}}}}
	store := func(tail ...any) []any {
		return append([]any{"BlockStored", []any{uint64(11)}, nil, tokens, 4, nil, nil, nil, nil}, tail...)
	}
	remove := func(tail ...any) []any {
		return append([]any{"BlockRemoved", []any{uint64(11)}, nil}, tail...)
	}
	tests := []struct {
		name      string
		event     []any
		group     kvevents.OptInt
		kind      string
		window    kvevents.OptInt
		locality  string
		mm        bool
		converted int // events Convert keeps, with no kind learned
	}{
		{"store, every field", store(0, "full_attention", nil, "LOCAL", "gpu"), kvevents.Some(0), "full_attention", kvevents.OptInt{}, "LOCAL", false, 1},
		{"store of a remote tier", store(0, "full_attention", nil, "REMOTE", "fs"), kvevents.Some(0), "full_attention", kvevents.OptInt{}, "REMOTE", false, 0},
		{"store, up to the window", store(1, "sliding_window", 128), kvevents.Some(1), "sliding_window", kvevents.Some(128), "", false, 0},
		{"store, kind without a group slot", store("full_attention"), kvevents.OptInt{}, "full_attention", kvevents.OptInt{}, "", false, 1},
		{"store, block_mm_infos first", store(mmInfos, 2, "full_attention"), kvevents.Some(2), "full_attention", kvevents.OptInt{}, "", true, 1},
		{"removal, every field", remove(0, "full_attention", nil, "LOCAL", nil), kvevents.Some(0), "full_attention", kvevents.OptInt{}, "LOCAL", false, 1},
		{"removal of a remote tier", remove(0, nil, nil, "REMOTE"), kvevents.Some(0), "", kvevents.OptInt{}, "REMOTE", false, 0},
		{"removal with its group's kind", remove(3, "full_attention"), kvevents.Some(3), "full_attention", kvevents.OptInt{}, "", false, 1},
		{"removal, kind without a group slot", remove("full_attention"), kvevents.OptInt{}, "full_attention", kvevents.OptInt{}, "", false, 1},
		{"removal, fields beyond the known ones", remove(3, "mla_attention", nil, "LOCAL", "gpu", "later", 9), kvevents.Some(3), "mla_attention", kvevents.OptInt{}, "LOCAL", false, 1},
		{"clear with its source_kind", []any{"AllBlocksCleared", "gpu"}, kvevents.OptInt{}, "", kvevents.OptInt{}, "", false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := msgp.AppendArrayHeader(nil, 3)
			p = msgp.AppendFloat64(p, 1757500000)
			p = msgp.AppendArrayHeader(p, 1)
			p, err := msgp.AppendIntf(p, tt.event)
			if err != nil {
				t.Fatal(err)
			}
			p = msgp.AppendInt(p, 0)
			var b kvevents.Batch
			if err := kvevents.DecodeBatch(p, &b); err != nil {
				t.Fatal(err)
			}
			if len(b.Events) != 1 {
				t.Fatalf("decoded %d events (%d invalid: %v), want 1", len(b.Events), b.Invalid, b.InvalidErr)
			}
			ev := &b.Events[0]
			if ev.GroupIdx != tt.group || ev.SpecKind != tt.kind || ev.SlidingWindow != tt.window || ev.Locality != tt.locality || (ev.BlockMMInfos != nil) != tt.mm {
				t.Fatalf("group %+v kind %q window %+v locality %q mm %v; want %+v %q %+v %q %v",
					ev.GroupIdx, ev.SpecKind, ev.SlidingWindow, ev.Locality, ev.BlockMMInfos != nil, tt.group, tt.kind, tt.window, tt.locality, tt.mm)
			}
			if ev.Fields != len(tt.event)-1 {
				t.Fatalf("Fields %d, want %d", ev.Fields, len(tt.event)-1)
			}
			// Fields beyond the known ones are not re-encoded.
			fields := ev.Fields
			ev.Fields = min(ev.Fields, kvevents.StoredFieldsMax)
			switch ev.Type {
			case kvevents.BlockRemoved:
				ev.Fields = min(ev.Fields, kvevents.RemovedFieldsMax)
			case kvevents.AllBlocksCleared:
				ev.Fields = min(ev.Fields, 1) // source_kind
			}
			out, err := kvevents.AppendBatch(nil, &b)
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			var back kvevents.Batch
			if err := kvevents.DecodeBatch(out, &back); err != nil || len(back.Events) != 1 {
				t.Fatalf("decode re-encoded: %v", err)
			}
			x := &back.Events[0]
			if x.GroupIdx != ev.GroupIdx || x.SpecKind != ev.SpecKind || x.SlidingWindow != ev.SlidingWindow || x.Locality != ev.Locality {
				t.Fatalf("re-encoded as %+v, want %+v", x, ev)
			}
			ev.Fields = fields
			c, err := kvevents.NewConverter(kvevents.ConverterConfig{BlockSize: 4})
			if err != nil {
				t.Fatal(err)
			}
			evs, err := c.Convert(nil, &b)
			if err != nil || len(evs) != tt.converted {
				t.Fatalf("converted %d events (%v), want %d", len(evs), err, tt.converted)
			}
		})
	}
}
