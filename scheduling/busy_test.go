package scheduling_test

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scheduling"
)

func TestBusyThresholds(t *testing.T) {
	tests := []struct {
		name string
		b    scheduling.BusyThresholds
		load scheduling.Load
		busy bool
	}{
		{"zero thresholds never busy", scheduling.BusyThresholds{}, scheduling.Load{ActiveDecodeBlocks: 1 << 20, ActivePrefillTokens: 1 << 20}, false},
		{"decode fraction over", scheduling.BusyThresholds{DecodeBlocks: 0.9}, scheduling.Load{ActiveDecodeBlocks: 91, KVCapacityBlocks: 100}, true},
		{"decode fraction at the threshold", scheduling.BusyThresholds{DecodeBlocks: 0.9}, scheduling.Load{ActiveDecodeBlocks: 90, KVCapacityBlocks: 100}, false},
		{"decode fraction, capacity unknown", scheduling.BusyThresholds{DecodeBlocks: 0.9}, scheduling.Load{ActiveDecodeBlocks: 1000}, false},
		{"decode absolute", scheduling.BusyThresholds{MaxDecodeBlocks: 500}, scheduling.Load{ActiveDecodeBlocks: 501}, true},
		{"prefill fraction over", scheduling.BusyThresholds{PrefillTokens: 2}, scheduling.Load{ActivePrefillTokens: 16385, MaxBatchedTokens: 8192}, true},
		{"prefill fraction under", scheduling.BusyThresholds{PrefillTokens: 2}, scheduling.Load{ActivePrefillTokens: 16384, MaxBatchedTokens: 8192}, false},
		{"prefill absolute", scheduling.BusyThresholds{MaxPrefillTokens: 4096}, scheduling.Load{ActivePrefillTokens: 4097}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NoError(t, tt.b.Validate())
			require.Equal(t, tt.busy, tt.b.Busy(&tt.load))
		})
	}
	for _, b := range []scheduling.BusyThresholds{{DecodeBlocks: -1}, {PrefillTokens: math.NaN()}, {MaxDecodeBlocks: -1}, {MaxPrefillTokens: -2}} {
		require.ErrorIs(t, b.Validate(), scheduling.ErrInvalidConfig)
	}
}

func TestBusyFilter(t *testing.T) {
	b := scheduling.BusyThresholds{MaxPrefillTokens: 100}
	mk := func(prefill ...int) []scheduling.Candidate {
		out := make([]scheduling.Candidate, len(prefill))
		for i, p := range prefill {
			out[i] = scheduling.Candidate{Worker: worker(uint64(i + 1)), Load: scheduling.Load{ActivePrefillTokens: p}}
		}
		return out
	}
	ids := func(cands []scheduling.Candidate) []uint64 {
		var out []uint64
		for _, c := range cands {
			out = append(out, uint64(c.Worker.ID))
		}
		return out
	}

	got, err := b.Filter(mk(500, 10, 200, 100, 0))
	require.NoError(t, err)
	require.Equal(t, []uint64{2, 4, 5}, ids(got))

	got, err = b.Filter(mk(1, 2))
	require.NoError(t, err)
	require.Equal(t, []uint64{1, 2}, ids(got))

	all := mk(101, 300)
	got, err = b.Filter(all)
	require.ErrorIs(t, err, scheduling.ErrAllBusy)
	var busy *scheduling.AllBusyError
	require.True(t, errors.As(err, &busy))
	require.Equal(t, 2, busy.Candidates)
	require.Equal(t, "scheduling: all 2 workers busy", err.Error())
	require.Equal(t, []uint64{1, 2}, ids(got))

	_, err = b.Filter(nil)
	require.ErrorIs(t, err, scheduling.ErrNoCandidates)
}
