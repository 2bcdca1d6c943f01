package kvevents_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
)

func readDynamoGolden(t testing.TB) [][]byte {
	raw, err := os.ReadFile("testdata/dynamo_router_events.jsonl")
	require.NoError(t, err)
	var lines [][]byte
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			lines = append(lines, append([]byte(nil), sc.Bytes()...))
		}
	}
	require.NoError(t, sc.Err())
	return lines
}

func TestDynamoGolden(t *testing.T) {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	locals := h.AppendBlockHashes(nil, []uint32{0, 1, 2, 3, 4, 5, 6, 7})
	want := []kvevents.DynamoEvent{
		{
			WorkerID: 7, StorageTier: "device", ResidencyDomain: "worker", EventID: 0, Kind: kvevents.DynamoStored,
			Blocks: []kvevents.DynamoBlock{
				{BlockHash: 16045690981402826360, TokensHash: uint64(locals[0])},
				{BlockHash: 18446744073709551615, TokensHash: uint64(locals[1])},
			},
		},
		{
			WorkerID: 7, StorageTier: "device", ResidencyDomain: "worker", EventID: 1, Kind: kvevents.DynamoRemoved,
			Removed: []uint64{18446744073709551615},
		},
		{WorkerID: 7, StorageTier: "device", EventID: 2, DPRank: 1, Kind: kvevents.DynamoCleared},
		{
			WorkerID: 9, StorageTier: "host_pinned", EventID: 5, Kind: kvevents.DynamoStored,
			HasParent: true, ParentHash: 16045690981402826360,
			Blocks: []kvevents.DynamoBlock{{BlockHash: 42, TokensHash: 43}},
		},
	}
	wantEvents := []kvroute.Event{
		{Kind: kvroute.EventStored, Worker: kvroute.WorkerKey{ID: 7}, ID: 1, Blocks: []kvroute.StoredBlock{
			{External: 16045690981402826360, Hash: locals[0]}, {External: 18446744073709551615, Hash: locals[1]},
		}},
		{Kind: kvroute.EventRemoved, Worker: kvroute.WorkerKey{ID: 7}, ID: 2, Removed: []kvroute.ExternalHash{18446744073709551615}},
		{Kind: kvroute.EventCleared, Worker: kvroute.WorkerKey{ID: 7, Rank: 1}, ID: 3},
		{Kind: kvroute.EventStored, Worker: kvroute.WorkerKey{ID: 9}, ID: 6, Tier: kvroute.TierHost, HasParent: true,
			Parent: 16045690981402826360, Blocks: []kvroute.StoredBlock{{External: 42, Hash: 43}}},
	}
	lines := readDynamoGolden(t)
	require.Len(t, lines, len(want))
	for i, line := range lines {
		var d kvevents.DynamoEvent
		require.NoError(t, json.Unmarshal(line, &d), "line %d", i)
		normalize(&d)
		require.Equal(t, want[i], d, "line %d", i)

		var ev kvroute.Event
		require.NoError(t, d.ToEvent(&ev))
		normalizeEvent(&ev)
		require.Equal(t, wantEvents[i], ev, "line %d", i)
		require.NoError(t, ev.Validate())

		// JSON and msgpack round trips keep the meaning.
		out, err := json.Marshal(&d)
		require.NoError(t, err)
		var back kvevents.DynamoEvent
		require.NoError(t, json.Unmarshal(out, &back))
		normalize(&back)
		require.Equal(t, d, back)

		mp, err := kvevents.AppendDynamoEvent(nil, &d)
		require.NoError(t, err)
		rest, err := kvevents.DecodeDynamoEvent(mp, &back)
		require.NoError(t, err)
		require.Empty(t, rest)
		normalize(&back)
		require.Equal(t, d, back)

		// FromEvent inverts ToEvent.
		var again kvevents.DynamoEvent
		require.NoError(t, again.FromEvent(&ev, kvroute.Hasher{}))
		require.Equal(t, d.EventID, again.EventID)
		require.Equal(t, d.Kind, again.Kind)
		require.Equal(t, len(d.Blocks), len(again.Blocks))
	}
}

func TestDynamoFromEventHashesTokens(t *testing.T) {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	ev := kvroute.Event{Kind: kvroute.EventStored, Worker: kvroute.WorkerKey{ID: 3}, LoRA: "adapter-a",
		Blocks: []kvroute.StoredBlock{{External: 1, Tokens: []uint32{0, 1, 2, 3}}}}
	var d kvevents.DynamoEvent
	require.NoError(t, d.FromEvent(&ev, h))
	require.Equal(t, uint64(6665157333201000639), d.Blocks[0].TokensHash)
	require.Equal(t, ^uint64(0), d.EventID, "an unsequenced event gets event_id 2^64-1")
	var back kvroute.Event
	require.NoError(t, d.ToEvent(&back))
	require.Zero(t, back.ID)
	require.ErrorIs(t, d.FromEvent(&ev, kvroute.Hasher{}), kvevents.ErrEncode)
}

// A RouterEvent cannot say that its hashes are sequence hashes: such an
// event is refused, not sent as content hashes.
func TestDynamoFromEventRefusesSeqHashes(t *testing.T) {
	ev := kvroute.Event{Kind: kvroute.EventStored, Worker: kvroute.WorkerKey{ID: 3}, SeqHashes: true,
		Blocks: []kvroute.StoredBlock{{External: 1, Hash: 2}}}
	var d kvevents.DynamoEvent
	require.ErrorIs(t, d.FromEvent(&ev, kvroute.Hasher{}), kvevents.ErrEncode)
}

func TestDynamoMalformed(t *testing.T) {
	tests := []struct {
		name string
		json string
	}{
		{"not json", `{`},
		{"unknown unit variant", `{"worker_id":1,"event":{"event_id":0,"data":"wiped"}}`},
		{"no variant", `{"worker_id":1,"event":{"event_id":0,"data":{}}}`},
		{"negative start", `{"worker_id":1,"event":{"event_id":0,"data":{"stored":{"start_position":-1,"blocks":[]}}}}`},
		{"float id", `{"worker_id":1.5,"event":{"event_id":0,"data":"cleared"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d kvevents.DynamoEvent
			require.ErrorIs(t, d.UnmarshalJSON([]byte(tt.json)), kvevents.ErrMalformed)
		})
	}
	var d kvevents.DynamoEvent
	_, err := kvevents.DecodeDynamoEvent([]byte{0x81, 0xa5, 'e', 'v', 'e', 'n', 't', 0x80}, &d)
	require.ErrorIs(t, err, kvevents.ErrMalformed)
}

// TestDynamoToEventResidency: events of the worker's own residency domain
// (residency_domain absent or "worker") convert; events of a cache owner's
// domain, or of a domain kvevents does not know, are not the worker's
// blocks (Dynamo's router does not index them as the worker's) and are
// refused, so that a cache owner's clear does not empty the worker.
func TestDynamoToEventResidency(t *testing.T) {
	tests := []struct {
		domain string
		own    bool
	}{
		{"", true},
		{"worker", true},
		{"cache_owner", false},
		{"pool", false},
	}
	for _, tt := range tests {
		t.Run(tt.domain, func(t *testing.T) {
			for _, kind := range []kvevents.DynamoKind{kvevents.DynamoStored, kvevents.DynamoRemoved, kvevents.DynamoCleared} {
				d := kvevents.DynamoEvent{WorkerID: 3, ResidencyDomain: tt.domain, EventID: 4, Kind: kind,
					Blocks: []kvevents.DynamoBlock{{BlockHash: 1, TokensHash: 2}}, Removed: []uint64{1}}
				var ev kvroute.Event
				err := d.ToEvent(&ev)
				if tt.own {
					require.NoError(t, err)
					require.Equal(t, kvroute.WorkerKey{ID: 3}, ev.Worker)
					continue
				}
				require.ErrorIs(t, err, kvevents.ErrOtherResidency)
			}
		})
	}
}

// TestDynamoJSONClearedNull: the cleared variant in the map form serde_json
// also reads, {"cleared": null}, is a cleared event.
func TestDynamoJSONClearedNull(t *testing.T) {
	var d kvevents.DynamoEvent
	require.NoError(t, d.UnmarshalJSON([]byte(`{"worker_id":4,"event":{"event_id":9,"data":{"cleared":null},"dp_rank":1}}`)))
	require.Equal(t, kvevents.DynamoCleared, d.Kind)
	require.Equal(t, uint64(9), d.EventID)
	require.Equal(t, uint32(1), d.DPRank)
}

// normalize turns empty slices into nil so that decoded values compare
// equal to literals.
func normalize(d *kvevents.DynamoEvent) {
	if len(d.Blocks) == 0 {
		d.Blocks = nil
	}
	if len(d.Removed) == 0 {
		d.Removed = nil
	}
}

func normalizeEvent(ev *kvroute.Event) {
	if len(ev.Blocks) == 0 {
		ev.Blocks = nil
	}
	if len(ev.Removed) == 0 {
		ev.Removed = nil
	}
}
