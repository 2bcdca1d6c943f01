package kvevents_test

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
)

func TestTierOfMedium(t *testing.T) {
	tests := []struct {
		medium string
		tier   kvroute.Tier
	}{
		{"", kvroute.TierDevice},
		{"GPU", kvroute.TierDevice},
		{"CPU", kvroute.TierHost},
		{"CPU_PINNED", kvroute.TierHost},
		{"DISK", kvroute.TierDisk},
		{"STORAGE", kvroute.TierExternal},
		{"EXTERNAL", kvroute.TierExternal},
		{"gpu", kvroute.TierExternal},
		// Dynamo's KV block manager (G1 device, G2 host, G3 disk) and the
		// other names Dynamo's router reads.
		{"DEVICE", kvroute.TierDevice},
		{"CPU_TIER1", kvroute.TierHost},
		{"CPU_TIER2", kvroute.TierDisk},
		{"NVME", kvroute.TierDisk},
		{"NETWORK", kvroute.TierExternal},
		{"REMOTE", kvroute.TierExternal},
		{"SHARED", kvroute.TierExternal},
	}
	for _, tt := range tests {
		require.Equal(t, tt.tier, kvevents.TierOfMedium(tt.medium), tt.medium)
	}
	for tier := range kvroute.Tier(kvroute.NumTiers) {
		require.Equal(t, tier, kvevents.TierOfMedium(kvevents.MediumOfTier(tier)))
		require.Equal(t, tier, kvevents.TierOfDynamo(kvevents.DynamoTierName(tier)))
	}
}

// TestConvertGolden checks every golden batch against its meaning file:
// block hashes computed from the token ids with the event's block size,
// external keys per the key_u64 rule, rank and tier.
func TestConvertGolden(t *testing.T) {
	for _, path := range goldenFiles(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			payload, m := readGolden(t, path)
			var b kvevents.Batch
			require.NoError(t, kvevents.DecodeBatch(payload, &b))
			c, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 11})
			require.NoError(t, err)
			evs, err := c.Convert(nil, &b)
			require.NoError(t, err)
			require.Len(t, evs, len(m.Events))
			rank := kvroute.DPRank(0)
			if m.DPRank != nil {
				rank = kvroute.DPRank(*m.DPRank)
			}
			for i, ge := range m.Events {
				ev := evs[i]
				require.NoError(t, ev.Validate())
				require.Equal(t, kvroute.WorkerKey{ID: 11, Rank: rank}, ev.Worker)
				require.Zero(t, ev.ID)
				switch ge.Type {
				case "BlockStored":
					require.Equal(t, kvroute.EventStored, ev.Kind)
					require.Equal(t, kvevents.TierOfMedium(str(ge.Medium)), ev.Tier)
					h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: *ge.BlockSize})
					require.Len(t, ev.Blocks, len(ge.BlockHashes))
					for j, gh := range ge.BlockHashes {
						key, _ := strconv.ParseUint(gh.KeyU64, 10, 64)
						bs := *ge.BlockSize
						require.Equal(t, kvroute.StoredBlock{
							External: kvroute.ExternalHash(key),
							Hash:     h.HashBlock(ge.TokenIDs[j*bs : (j+1)*bs]),
						}, ev.Blocks[j])
					}
					require.Equal(t, ge.Parent != nil, ev.HasParent)
					if ge.Parent != nil {
						key, _ := strconv.ParseUint(ge.Parent.KeyU64, 10, 64)
						require.Equal(t, kvroute.ExternalHash(key), ev.Parent)
					}
				case "BlockRemoved":
					require.Equal(t, kvroute.EventRemoved, ev.Kind)
					require.Equal(t, kvevents.TierOfMedium(str(ge.Medium)), ev.Tier)
					require.Len(t, ev.Removed, len(ge.BlockHashes))
					for j, gh := range ge.BlockHashes {
						key, _ := strconv.ParseUint(gh.KeyU64, 10, 64)
						require.Equal(t, kvroute.ExternalHash(key), ev.Removed[j])
					}
				case "AllBlocksCleared":
					require.Equal(t, kvroute.EventCleared, ev.Kind)
				}
			}
		})
	}
}

func seq(n, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

func TestConvertRules(t *testing.T) {
	h4 := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	tests := []struct {
		name    string
		cfg     kvevents.ConverterConfig
		batch   kvevents.Batch
		want    []kvroute.Event
		wantErr error
		stats   kvevents.ConvertStats
	}{
		{
			name: "partial last block dropped",
			cfg:  kvevents.ConverterConfig{BlockSize: 4},
			batch: kvevents.Batch{Events: []kvevents.EngineEvent{{Type: kvevents.BlockStored, BlockSize: 4,
				BlockHashes: []kvevents.Hash{kvevents.UintHash(1), kvevents.UintHash(2)}, TokenIDs: seq(6, 0)}}},
			want: []kvroute.Event{{Kind: kvroute.EventStored, Blocks: []kvroute.StoredBlock{
				{External: 1, Hash: h4.HashBlock(seq(4, 0))}}}},
			stats: kvevents.ConvertStats{DroppedBlocks: 1},
		},
		{
			name: "default block size, lora, tier and rank",
			cfg:  kvevents.ConverterConfig{Worker: 5, BlockSize: 4},
			batch: kvevents.Batch{DPRank: kvevents.Some(2), Events: []kvevents.EngineEvent{{Type: kvevents.BlockStored,
				BlockHashes: []kvevents.Hash{kvevents.IntHash(-1)}, ParentBlockHash: kvevents.UintHash(9),
				TokenIDs: seq(4, 0), LoRAName: "adapter-a", Medium: "CPU"}}},
			want: []kvroute.Event{{Kind: kvroute.EventStored, Worker: kvroute.WorkerKey{ID: 5, Rank: 2}, Tier: kvroute.TierHost,
				HasParent: true, Parent: 9, LoRA: "adapter-a",
				Blocks: []kvroute.StoredBlock{{External: ^kvroute.ExternalHash(0), Hash: 6665157333201000639}}}},
		},
		{
			name: "cache salt is a namespace",
			cfg:  kvevents.ConverterConfig{BlockSize: 4},
			batch: kvevents.Batch{Events: []kvevents.EngineEvent{{Type: kvevents.BlockStored,
				BlockHashes: []kvevents.Hash{kvevents.UintHash(1)}, TokenIDs: seq(4, 0), CacheSalt: "s"}}},
			want: []kvroute.Event{{Kind: kvroute.EventStored, Blocks: []kvroute.StoredBlock{{External: 1,
				Hash: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4, Namespace: "s"}).HashBlock(seq(4, 0))}}}},
			stats: kvevents.ConvertStats{Salted: 1},
		},
		{
			name: "sliding window and tokenless events skipped",
			cfg:  kvevents.ConverterConfig{BlockSize: 4},
			batch: kvevents.Batch{Events: []kvevents.EngineEvent{
				{Type: kvevents.BlockStored, BlockSize: 4, SpecKind: "sliding_window",
					BlockHashes: []kvevents.Hash{kvevents.UintHash(1)}, TokenIDs: seq(4, 0)},
				{Type: kvevents.BlockStored, BlockSize: 4, BlockHashes: []kvevents.Hash{kvevents.UintHash(2)}},
				{Type: kvevents.BlockRemoved, Medium: "DISK", BlockHashes: []kvevents.Hash{kvevents.BytesHash([]byte{1, 2})}},
				{Type: kvevents.AllBlocksCleared, Medium: "DISK"},
			}},
			want: []kvroute.Event{
				{Kind: kvroute.EventRemoved, Tier: kvroute.TierDisk, Removed: []kvroute.ExternalHash{0x0102}},
				{Kind: kvroute.EventCleared},
			},
			stats: kvevents.ConvertStats{SkippedEvents: 2, DroppedBlocks: 1, SkippedGroupEvents: 1, SkippedGroupBlocks: 1},
		},
		{
			name:    "rank out of range",
			batch:   kvevents.Batch{DPRank: kvevents.Some(-1)},
			wantErr: kvevents.ErrInvalidEvent,
		},
		{
			name: "block size out of range",
			batch: kvevents.Batch{Events: []kvevents.EngineEvent{{Type: kvevents.BlockStored, BlockSize: kvroute.MaxBlockSize + 1,
				BlockHashes: []kvevents.Hash{kvevents.UintHash(1)}}}},
			stats: kvevents.ConvertStats{SkippedEvents: 1, InvalidEvents: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := kvevents.NewConverter(tt.cfg)
			require.NoError(t, err)
			got, err := c.Convert(nil, &tt.batch)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				require.Empty(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.stats, c.Stats())
		})
	}
	_, err := kvevents.NewConverter(kvevents.ConverterConfig{BlockSize: -1})
	require.ErrorIs(t, err, kvevents.ErrConfig)
}

// TestConvertReusesArenas: the events of one Convert call are the same
// when its arenas were used before, also when a caller changed an earlier
// event's blocks (the converter hands out Hash, never Tokens).
func TestConvertReusesArenas(t *testing.T) {
	c, err := kvevents.NewConverter(kvevents.ConverterConfig{BlockSize: 4})
	require.NoError(t, err)
	h4 := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	batch := func(base uint32) *kvevents.Batch {
		return &kvevents.Batch{Events: []kvevents.EngineEvent{
			{Type: kvevents.BlockRemoved, BlockHashes: []kvevents.Hash{kvevents.UintHash(uint64(base)), kvevents.UintHash(uint64(base + 1))}},
			{Type: kvevents.BlockStored, BlockSize: 4, TokenIDs: seq(8, base),
				BlockHashes: []kvevents.Hash{kvevents.UintHash(uint64(base)), kvevents.UintHash(uint64(base + 1))}},
		}}
	}
	want := func(base uint32) []kvroute.Event {
		return []kvroute.Event{
			{Kind: kvroute.EventRemoved, Removed: []kvroute.ExternalHash{kvroute.ExternalHash(base), kvroute.ExternalHash(base + 1)}},
			{Kind: kvroute.EventStored, Blocks: []kvroute.StoredBlock{
				{External: kvroute.ExternalHash(base), Hash: h4.HashBlock(seq(4, base))},
				{External: kvroute.ExternalHash(base + 1), Hash: h4.HashBlock(seq(4, base+4))}}},
		}
	}
	evs, err := c.Convert(nil, batch(10))
	require.NoError(t, err)
	require.Equal(t, want(10), evs)
	evs[1].Blocks[0].Tokens = seq(4, 99)
	evs[1].Blocks[1].Tokens = seq(4, 99)
	evs, err = c.Convert(evs[:0], batch(20))
	require.NoError(t, err)
	require.Equal(t, want(20), evs)
}

// TestConvertIntoIndex feeds the current map layout into the indexer and
// checks the prefix it ends up with.
func TestConvertIntoIndex(t *testing.T) {
	payload, _ := readGolden(t, "testdata/vllm_map_mixed_dp0.msgpack")
	var b kvevents.Batch
	require.NoError(t, kvevents.DecodeBatch(payload, &b))
	c, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 1})
	require.NoError(t, err)
	evs, err := c.Convert(nil, &b)
	require.NoError(t, err)
	ix, err := indexer.New(indexer.Config{})
	require.NoError(t, err)
	w := kvroute.WorkerKey{ID: 1}
	// Apply the two stores only: a root of two blocks and a child of the second.
	for i := range evs[:2] {
		require.NoError(t, ix.Apply(&evs[i]))
	}
	h := kvroute.MustHasher(kvroute.HasherConfig{})
	tokens := append(append([]uint32(nil), b.Events[0].TokenIDs...), b.Events[1].TokenIDs...)
	want := h.AppendSeqHashes(nil, tokens)
	require.ElementsMatch(t, want, ix.AppendWorkerBlocks(w, nil))
	for i := range evs[2:] {
		require.NoError(t, ix.Apply(&evs[2+i]))
	}
	require.Empty(t, ix.AppendWorkerBlocks(w, nil))
}
