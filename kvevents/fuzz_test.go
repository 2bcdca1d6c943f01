package kvevents_test

import (
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
)

// FuzzDecodeBatch: arbitrary bytes give a batch or an error, never a
// panic; a decoded batch converts, re-encodes and decodes to the same
// events.
func FuzzDecodeBatch(f *testing.F) {
	for _, payload := range seedPayloads(f) {
		f.Add(payload)
	}
	c, err := kvevents.NewConverter(kvevents.ConverterConfig{})
	if err != nil {
		f.Fatal(err)
	}
	var b, back kvevents.Batch
	var evs []kvroute.Event
	f.Fuzz(func(t *testing.T, payload []byte) {
		if err := kvevents.DecodeBatch(payload, &b); err != nil {
			return
		}
		evs, _ = c.Convert(evs[:0], &b)
		for i := range evs {
			if err := evs[i].Validate(); err != nil {
				t.Fatalf("converted event %d invalid: %v", i, err)
			}
		}
		for i := range b.Events {
			// Unknown trailing array fields are not re-encoded, nor is the
			// block_mm_infos some array-layout tails carry.
			max := kvevents.StoredFieldsMax
			switch b.Events[i].Type {
			case kvevents.BlockRemoved:
				max = kvevents.RemovedFieldsMax
			case kvevents.AllBlocksCleared:
				max = 1 // source_kind
			}
			b.Events[i].Fields = min(b.Events[i].Fields, max)
			if b.Events[i].Layout == kvevents.LayoutArray {
				b.Events[i].BlockMMInfos = nil
			}
		}
		out, err := kvevents.AppendBatch(nil, &b)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if err := kvevents.DecodeBatch(out, &back); err != nil {
			t.Fatalf("decode re-encoded: %v", err)
		}
		if len(back.Events) != len(b.Events) {
			t.Fatalf("re-decoded %d events, want %d", len(back.Events), len(b.Events))
		}
		if back.Timestamp != b.Timestamp && b.Timestamp == b.Timestamp { // NaN stays NaN
			t.Fatalf("timestamp %v became %v", b.Timestamp, back.Timestamp)
		}
		for i := range b.Events {
			x, y := &b.Events[i], &back.Events[i]
			if x.Type != y.Type || len(x.BlockHashes) != len(y.BlockHashes) || len(x.TokenIDs) != len(y.TokenIDs) ||
				x.ParentBlockHash.Key != y.ParentBlockHash.Key || x.Medium != y.Medium || x.BlockSize != y.BlockSize ||
				x.Eagle != y.Eagle && len(x.TokenIDs) > 0 || x.CacheSalt != y.CacheSalt || x.LoRAName != y.LoRAName || x.SaltMetadata != y.SaltMetadata ||
				string(x.ExtraKeys) != string(y.ExtraKeys) || string(x.LookaheadTokenIDs) != string(y.LookaheadTokenIDs) ||
				string(x.BlockMMInfos) != string(y.BlockMMInfos) ||
				x.GroupIdx != y.GroupIdx || x.SpecKind != y.SpecKind || x.SlidingWindow != y.SlidingWindow || x.Locality != y.Locality {
				t.Fatalf("event %d changed in a round trip: %+v vs %+v", i, x, y)
			}
			for j := range x.BlockHashes {
				if x.BlockHashes[j].Key != y.BlockHashes[j].Key || x.BlockHashes[j].Kind != y.BlockHashes[j].Kind {
					t.Fatalf("event %d hash %d changed", i, j)
				}
			}
			for j := range x.TokenIDs {
				if x.TokenIDs[j] != y.TokenIDs[j] {
					t.Fatalf("event %d token %d changed", i, j)
				}
			}
		}
	})
}

// FuzzDecodeDynamo: arbitrary msgpack gives an event or an error; a
// decoded event re-encodes to an equal one.
func FuzzDecodeDynamo(f *testing.F) {
	for _, line := range readDynamoGolden(f) {
		var d kvevents.DynamoEvent
		if err := json.Unmarshal(line, &d); err != nil {
			f.Fatal(err)
		}
		mp, err := kvevents.AppendDynamoEvent(nil, &d)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(mp)
	}
	var d, back kvevents.DynamoEvent
	var ev kvroute.Event
	f.Fuzz(func(t *testing.T, payload []byte) {
		if _, err := kvevents.DecodeDynamoEvent(payload, &d); err != nil {
			return
		}
		if err := d.ToEvent(&ev); err != nil && !otherResidency(&d, err) {
			t.Fatalf("decoded event does not convert: %v", err)
		}
		out, err := kvevents.AppendDynamoEvent(nil, &d)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if _, err := kvevents.DecodeDynamoEvent(out, &back); err != nil {
			t.Fatalf("decode re-encoded: %v", err)
		}
		if back.EventID != d.EventID || back.WorkerID != d.WorkerID || back.Kind != d.Kind ||
			len(back.Blocks) != len(d.Blocks) || len(back.Removed) != len(d.Removed) {
			t.Fatalf("round trip changed the event: %+v vs %+v", d, back)
		}
	})
}

// otherResidency reports whether err is ToEvent's refusal of an event of
// another residency domain than its worker's, and d is one.
func otherResidency(d *kvevents.DynamoEvent, err error) bool {
	return errors.Is(err, kvevents.ErrOtherResidency) && d.ResidencyDomain != "" && d.ResidencyDomain != kvevents.ResidencyWorker
}

// FuzzDynamoJSON: arbitrary JSON gives an event or an error, never a panic.
func FuzzDynamoJSON(f *testing.F) {
	for _, line := range readDynamoGolden(f) {
		f.Add(line)
	}
	var d kvevents.DynamoEvent
	var ev kvroute.Event
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := d.UnmarshalJSON(data); err != nil {
			return
		}
		if err := d.ToEvent(&ev); err != nil && !otherResidency(&d, err) {
			t.Fatalf("decoded event does not convert: %v", err)
		}
		if _, err := json.Marshal(&d); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
	})
}

// seedPayloads are the golden and captured batches.
func seedPayloads(f *testing.F) [][]byte {
	var out [][]byte
	for _, path := range goldenFiles(f) {
		payload, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, payload)
	}
	for _, c := range capturedFiles(f) {
		out = append(out, c.payload)
	}
	return out
}

// FuzzConvert: any decodable batch converts, with or without re-chunking
// and across calls (salt, group and re-chunking state), into valid events
// whose stored blocks are whole router blocks.
func FuzzConvert(f *testing.F) {
	for _, payload := range seedPayloads(f) {
		f.Add(payload)
	}
	cfgs := []kvevents.ConverterConfig{
		{BlockSize: 16},
		{BlockSize: 4},
		{BlockSize: 4, RejectBlockSize: true, LoRAs: map[int64]string{7: "adapter-a"}},
		{BlockSize: 16, Rank: 3, GroupKinds: map[int64]string{1: kvevents.KindMamba}, ReuseKinds: []string{kvevents.KindSlidingWindow}},
		{BlockSize: 16, ExpectTierCopies: true},
	}
	var convs []*kvevents.Converter
	for _, cfg := range cfgs {
		c, err := kvevents.NewConverter(cfg)
		if err != nil {
			f.Fatal(err)
		}
		convs = append(convs, c)
	}
	var b kvevents.Batch
	var evs []kvroute.Event
	f.Fuzz(func(t *testing.T, payload []byte) {
		if err := kvevents.DecodeBatch(payload, &b); err != nil {
			return
		}
		for _, c := range convs {
			for range 2 {
				var err error
				if evs, err = c.Convert(evs[:0], &b); err != nil {
					continue
				}
				for i := range evs {
					if err := evs[i].Validate(); err != nil {
						t.Fatalf("converted event %d invalid: %v", i, err)
					}
					if evs[i].Kind == kvroute.EventStored && len(evs[i].Blocks) == 0 {
						t.Fatalf("stored event %d without blocks", i)
					}
				}
			}
		}
	})
}

// FuzzParseExtraKeys: arbitrary extra_keys give per-block items or an
// error, never a panic, and at most one entry per declared block.
func FuzzParseExtraKeys(f *testing.F) {
	var b kvevents.Batch
	for _, payload := range seedPayloads(f) {
		if err := kvevents.DecodeBatch(payload, &b); err != nil {
			continue
		}
		for _, ev := range b.Events {
			if ev.ExtraKeys != nil {
				f.Add(append([]byte(nil), ev.ExtraKeys...), ev.LoRAName, !ev.ParentBlockHash.Valid())
			}
		}
	}
	f.Add([]byte{0x91, 0x92, 0xa1, 'a', 0xc4, 0x01, 0x00}, "a", true)
	f.Add([]byte{0x92, 0x92, 0xa1, 'm', 0xa1, 's', 0x91, 0xa1, 'm'}, "", true)
	var x kvevents.ExtraKeys
	f.Fuzz(func(t *testing.T, raw []byte, lora string, root bool) {
		if err := kvevents.ParseExtraKeys(raw, lora, root, &x); err != nil {
			return
		}
		if len(x.MM) > len(raw) {
			t.Fatalf("%d blocks from %d bytes", len(x.MM), len(raw))
		}
	})
}

// FuzzParseBlockMMInfos: arbitrary block_mm_infos give per-block object
// hashes or an error, never a panic, and no more entries or hashes than
// the bytes could hold.
func FuzzParseBlockMMInfos(f *testing.F) {
	info := func(v any) []byte {
		p, err := msgp.AppendIntf(nil, v)
		if err != nil {
			f.Fatal(err)
		}
		return p
	}
	f.Add(info([]any{map[string]any{"mm_objects": []any{map[string]any{"mm_hash": uint64(1 << 63), "offsets": []any{[]any{0, 4}}}}}, nil}))
	f.Add(info([]any{nil, map[string]any{"mm_objects": nil, "x": 1}}))
	f.Add(info([]any{map[string]any{"mm_objects": []any{map[string]any{"mm_hash": -1}}}}))
	var x kvevents.ExtraKeys
	f.Fuzz(func(t *testing.T, raw []byte) {
		if err := kvevents.ParseBlockMMInfos(raw, &x); err != nil {
			return
		}
		n := 0
		for _, mm := range x.MM {
			n += len(mm)
		}
		if len(x.MM) > len(raw) || n > len(raw) {
			t.Fatalf("%d blocks, %d hashes from %d bytes", len(x.MM), n, len(raw))
		}
	})
}
