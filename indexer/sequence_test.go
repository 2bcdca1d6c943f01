package indexer_test

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
)

// A worker's sequence never wedges: after the largest event ID, the next
// is 1 (0 marks unsequenced events), and anything else asks for a replay
// from 1 instead of being dropped as a duplicate forever. A malformed
// event's ID is taken only as the next of an established sequence, never
// as a baseline, so a garbled ID cannot make every later event of its
// worker a duplicate.
func TestSequenceNeverWedges(t *testing.T) {
	w := wk(1)
	tests := []struct {
		name   string
		events []*kvroute.Event
		errs   []error // per event; nil means applied
		last   uint64  // LastEventID after the events
		held   int     // blocks of prompt(1, 2) the worker holds after
	}{
		{
			name: "the largest ID is followed by 1",
			events: []*kvroute.Event{
				stored(w, math.MaxUint64, 0, 0, []H{1}, prompt(1)),
				stored(w, 1, 0, 1, []H{2}, prompt(2)),
			},
			errs: []error{nil, nil},
			last: 1,
			held: 2,
		},
		{
			name: "after the largest ID, another asks for 1",
			events: []*kvroute.Event{
				stored(w, math.MaxUint64, 0, 0, []H{1}, prompt(1)),
				stored(w, 7, 0, 1, []H{2}, prompt(2)),
				stored(w, math.MaxUint64, 0, 1, []H{2}, prompt(2)),
				stored(w, 1, 0, 1, []H{2}, prompt(2)),
			},
			errs: []error{nil, indexer.ErrGap, indexer.ErrDuplicate, nil},
			last: 1,
			held: 2,
		},
		{
			name: "a malformed first event sets no baseline",
			events: []*kvroute.Event{
				cleared(w, 0), // the worker is known and unsequenced
				{Kind: kvroute.EventStored, Worker: w, ID: math.MaxUint64, Tier: kvroute.NumTiers},
				stored(w, 5, 0, 0, []H{1}, prompt(1)),
				stored(w, 6, 0, 1, []H{2}, prompt(2)),
			},
			errs: []error{nil, kvroute.ErrInvalidEvent, nil, nil},
			last: 6,
			held: 2,
		},
		{
			name: "a malformed event in sequence is consumed",
			events: []*kvroute.Event{
				stored(w, 5, 0, 0, []H{1}, prompt(1)),
				{Kind: kvroute.EventStored, Worker: w, ID: 6, Tier: kvroute.NumTiers},
				stored(w, 7, 0, 1, []H{2}, prompt(2)),
			},
			errs: []error{nil, kvroute.ErrInvalidEvent, nil},
			last: 7,
			held: 2,
		},
		{
			name: "a malformed event out of sequence is not",
			events: []*kvroute.Event{
				stored(w, 5, 0, 0, []H{1}, prompt(1)),
				{Kind: kvroute.EventStored, Worker: w, ID: math.MaxUint64, Tier: kvroute.NumTiers},
				stored(w, 6, 0, 1, []H{2}, prompt(2)),
			},
			errs: []error{nil, kvroute.ErrInvalidEvent, nil},
			last: 6,
			held: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := newIndex(t)
			for i, ev := range tt.events {
				err := ix.Apply(ev)
				if tt.errs[i] == nil {
					require.NoError(t, err, "event %d", i)
				} else {
					require.ErrorIs(t, err, tt.errs[i], "event %d", i)
				}
			}
			last, ok := ix.LastEventID(w)
			require.True(t, ok)
			require.Equal(t, tt.last, last)
			require.Equal(t, dev(tt.held), matchMap(ix, prompt(1, 2))[w])
		})
	}

	// A gap after the largest ID asks for 1.
	ix := newIndex(t)
	require.NoError(t, ix.Apply(stored(w, math.MaxUint64, 0, 0, []H{1}, prompt(1))))
	var gap *indexer.GapError
	require.True(t, errors.As(ix.Apply(stored(w, 3, 0, 1, []H{2}, prompt(2))), &gap))
	require.Equal(t, indexer.GapError{Worker: w, Want: 1, Got: 3}, *gap)
}
