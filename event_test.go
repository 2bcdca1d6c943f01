package kvroute_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
)

func TestEventValidate(t *testing.T) {
	blocks := []kvroute.StoredBlock{{External: 1, Hash: 2}}
	removed := []kvroute.ExternalHash{1}
	tests := []struct {
		name  string
		ev    kvroute.Event
		valid bool
	}{
		{"stored at the root", kvroute.Event{Kind: kvroute.EventStored, Blocks: blocks}, true},
		{"stored under a parent in host memory", kvroute.Event{Kind: kvroute.EventStored, Tier: kvroute.TierHost, HasParent: true, Parent: 9, Blocks: blocks}, true},
		{"stored with no block", kvroute.Event{Kind: kvroute.EventStored, HasParent: true, Parent: 9}, true},
		{"stored with a LoRA name and tokens", kvroute.Event{Kind: kvroute.EventStored, LoRA: "adapter-a", Blocks: []kvroute.StoredBlock{{External: 1, Tokens: make([]uint32, 16)}}}, true},
		{"stored of sequence hashes", kvroute.Event{Kind: kvroute.EventStored, SeqHashes: true, HasParent: true, Parent: 9, Blocks: blocks}, true},
		{"removed", kvroute.Event{Kind: kvroute.EventRemoved, Tier: kvroute.TierExternal, Removed: removed}, true},
		{"removed with no hash", kvroute.Event{Kind: kvroute.EventRemoved}, true},
		{"cleared", kvroute.Event{Kind: kvroute.EventCleared}, true},
		{"cleared from disk", kvroute.Event{Kind: kvroute.EventCleared, Tier: kvroute.TierDisk}, true},
		{"no kind", kvroute.Event{Blocks: blocks}, false},
		{"unknown kind", kvroute.Event{Kind: kvroute.EventCleared + 1}, false},
		{"unknown tier", kvroute.Event{Kind: kvroute.EventStored, Tier: kvroute.NumTiers, Blocks: blocks}, false},
		{"stored with removed hashes", kvroute.Event{Kind: kvroute.EventStored, Blocks: blocks, Removed: removed}, false},
		{"removed with blocks", kvroute.Event{Kind: kvroute.EventRemoved, Removed: removed, Blocks: blocks}, false},
		{"removed under a parent", kvroute.Event{Kind: kvroute.EventRemoved, Removed: removed, HasParent: true}, false},
		{"cleared with blocks", kvroute.Event{Kind: kvroute.EventCleared, Blocks: blocks}, false},
		{"cleared with removed hashes", kvroute.Event{Kind: kvroute.EventCleared, Removed: removed}, false},
		{"cleared under a parent", kvroute.Event{Kind: kvroute.EventCleared, HasParent: true}, false},
		{"stored of sequence hashes with tokens", kvroute.Event{Kind: kvroute.EventStored, SeqHashes: true, Blocks: []kvroute.StoredBlock{{External: 1, Tokens: make([]uint32, 16)}}}, false},
		{"removed of sequence hashes", kvroute.Event{Kind: kvroute.EventRemoved, SeqHashes: true, Removed: removed}, false},
		{"cleared of sequence hashes", kvroute.Event{Kind: kvroute.EventCleared, SeqHashes: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.ev.Validate()
			if tt.valid {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, kvroute.ErrInvalidEvent)
		})
	}
}

func TestEventStrings(t *testing.T) {
	w := kvroute.WorkerKey{ID: 7, Rank: 2}
	tests := []struct {
		ev   kvroute.Event
		want string
	}{
		{kvroute.Event{Kind: kvroute.EventStored, Worker: w, ID: 3, Tier: kvroute.TierHost, Blocks: make([]kvroute.StoredBlock, 2)}, "stored{worker=7/2 id=3 tier=host blocks=2}"},
		{kvroute.Event{Kind: kvroute.EventRemoved, Worker: w, ID: 4, Removed: make([]kvroute.ExternalHash, 5)}, "removed{worker=7/2 id=4 tier=device blocks=5}"},
		{kvroute.Event{Kind: kvroute.EventCleared, Worker: w, ID: 5}, "cleared{worker=7/2 id=5}"},
		{kvroute.Event{Kind: 9, Worker: w}, "kind(9){worker=7/2 id=0}"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, tt.ev.String())
	}
	require.Equal(t, "tier(4)", kvroute.Tier(kvroute.NumTiers).String())
}
