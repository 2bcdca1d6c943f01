package indexer_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/internal/clocktest"
)

type H = kvroute.ExternalHash

func newIndex(t testing.TB) *indexer.Index {
	ix, err := indexer.New(indexer.Config{Hasher: testHasher})
	require.NoError(t, err)
	return ix
}

// matchMap returns worker → ByTier for the prompt.
func matchMap(ix *indexer.Index, tokens []uint32) map[kvroute.WorkerKey][kvroute.NumTiers]int {
	var res indexer.MatchResult
	ix.Match(seqsOf(tokens), &res)
	out := map[kvroute.WorkerKey][kvroute.NumTiers]int{}
	for _, m := range res.Workers {
		sum := 0
		for _, c := range m.ByTier {
			sum += c
		}
		if sum != m.Blocks {
			panic("tier counts do not add up")
		}
		out[m.Worker] = m.ByTier
	}
	return out
}

func dev(n int) [kvroute.NumTiers]int { return [kvroute.NumTiers]int{n} }

func TestApplyAndMatch(t *testing.T) {
	a, b, c := wk(1), wk(2), wk(3)
	tests := []struct {
		name   string
		events []*kvroute.Event
		errs   []error // per event; nil entries mean success
		prompt []uint32
		want   map[kvroute.WorkerKey][kvroute.NumTiers]int
	}{
		{
			name:   "empty index",
			prompt: prompt(1, 2, 3),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{},
		},
		{
			name: "one worker full prefix",
			events: []*kvroute.Event{
				stored(a, 1, kvroute.TierDevice, 0, []H{11, 12, 13}, prompt(1, 2, 3)),
			},
			prompt: prompt(1, 2, 3, 4),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(3)},
		},
		{
			name: "stored with parent extends the chain",
			events: []*kvroute.Event{
				stored(a, 1, kvroute.TierDevice, 0, []H{11}, prompt(1)),
				stored(a, 2, kvroute.TierDevice, 11, []H{12, 13}, prompt(2, 3)),
			},
			prompt: prompt(1, 2, 3),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(3)},
		},
		{
			name: "workers diverge",
			events: []*kvroute.Event{
				stored(a, 1, kvroute.TierDevice, 0, []H{11, 12, 13}, prompt(1, 2, 3)),
				stored(b, 1, kvroute.TierDevice, 0, []H{21, 22}, prompt(1, 2)),
				stored(c, 1, kvroute.TierDevice, 0, []H{31, 32}, prompt(1, 9)),
			},
			prompt: prompt(1, 2, 3),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(3), b: dev(2), c: dev(1)},
		},
		{
			name: "different prefix same block content does not match",
			events: []*kvroute.Event{
				stored(a, 1, kvroute.TierDevice, 0, []H{11, 12}, prompt(9, 2)),
			},
			prompt: prompt(1, 2),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{},
		},
		{
			name: "tiers count at the fastest",
			events: []*kvroute.Event{
				stored(a, 1, kvroute.TierDevice, 0, []H{11, 12}, prompt(1, 2)),
				stored(a, 2, kvroute.TierHost, 0, []H{11, 12, 13}, prompt(1, 2, 3)),
				stored(a, 3, kvroute.TierDisk, 13, []H{14}, prompt(4)),
				removed(a, 4, kvroute.TierDevice, 12),
			},
			prompt: prompt(1, 2, 3, 4, 5),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{a: {1, 2, 1, 0}},
		},
		{
			name: "removed block cuts the prefix",
			events: []*kvroute.Event{
				stored(a, 1, kvroute.TierDevice, 0, []H{11, 12, 13}, prompt(1, 2, 3)),
				removed(a, 2, kvroute.TierDevice, 12),
			},
			prompt: prompt(1, 2, 3),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(1)},
		},
		{
			name: "cleared drops the worker's blocks only",
			events: []*kvroute.Event{
				stored(a, 1, kvroute.TierDevice, 0, []H{11, 12}, prompt(1, 2)),
				stored(b, 1, kvroute.TierDevice, 0, []H{21, 22}, prompt(1, 2)),
				cleared(a, 2),
			},
			prompt: prompt(1, 2),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{b: dev(2)},
		},
		{
			name: "unknown parent attaches nothing",
			events: []*kvroute.Event{
				stored(a, 1, kvroute.TierDevice, 0, []H{11}, prompt(1)),
				stored(a, 2, kvroute.TierDevice, 99, []H{12}, prompt(2)),
				stored(a, 3, kvroute.TierDevice, 11, []H{12}, prompt(2)),
			},
			errs:   []error{nil, indexer.ErrUnknownParent, nil},
			prompt: prompt(1, 2),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(2)},
		},
		{
			name: "unknown parent does not land at the root",
			events: []*kvroute.Event{
				stored(a, 1, kvroute.TierDevice, 99, []H{11}, prompt(1)),
			},
			errs:   []error{indexer.ErrUnknownParent},
			prompt: prompt(1),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{},
		},
		{
			name: "unknown removal is not fatal",
			events: []*kvroute.Event{
				stored(a, 1, kvroute.TierDevice, 0, []H{11}, prompt(1)),
				removed(a, 2, kvroute.TierDevice, 77),
				removed(a, 3, kvroute.TierHost, 11),
			},
			prompt: prompt(1),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(1)},
		},
		{
			name: "duplicate and gap are rejected",
			events: []*kvroute.Event{
				stored(a, 5, kvroute.TierDevice, 0, []H{11}, prompt(1)),
				stored(a, 5, kvroute.TierDevice, 11, []H{12}, prompt(2)),
				stored(a, 7, kvroute.TierDevice, 11, []H{12}, prompt(2)),
				stored(a, 6, kvroute.TierDevice, 11, []H{12}, prompt(2)),
				removed(a, 6, kvroute.TierDevice, 12),
			},
			errs:   []error{nil, indexer.ErrDuplicate, indexer.ErrGap, nil, indexer.ErrDuplicate},
			prompt: prompt(1, 2),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(2)},
		},
		{
			name: "two engine hashes for one block",
			events: []*kvroute.Event{
				stored(a, 1, kvroute.TierDevice, 0, []H{11}, prompt(1)),
				stored(a, 2, kvroute.TierDevice, 0, []H{51}, prompt(1)),
				removed(a, 3, kvroute.TierDevice, 11),
			},
			prompt: prompt(1),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(1)},
		},
		{
			name: "engine hash reused for other content",
			events: []*kvroute.Event{
				stored(a, 1, kvroute.TierDevice, 0, []H{11}, prompt(1)),
				stored(a, 2, kvroute.TierDevice, 0, []H{11}, prompt(8)),
			},
			prompt: prompt(1),
			want:   map[kvroute.WorkerKey][kvroute.NumTiers]int{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := newIndex(t)
			for i, ev := range tt.events {
				err := ix.Apply(ev)
				var want error
				if i < len(tt.errs) {
					want = tt.errs[i]
				}
				if want == nil {
					require.NoError(t, err, "event %d", i)
				} else {
					require.ErrorIs(t, err, want, "event %d", i)
				}
			}
			require.Equal(t, tt.want, matchMap(ix, tt.prompt))
			checkDumpRoundTrip(t, ix, tt.prompt)
		})
	}
}

func TestGapErrorCarriesPosition(t *testing.T) {
	ix := newIndex(t)
	require.NoError(t, ix.Apply(stored(wk(1), 3, 0, 0, []H{1}, prompt(1))))
	err := ix.Apply(removed(wk(1), 9, 0, 1))
	var gap *indexer.GapError
	require.True(t, errors.As(err, &gap))
	require.Equal(t, indexer.GapError{Worker: wk(1), Want: 4, Got: 9}, *gap)
	last, ok := ix.LastEventID(wk(1))
	require.True(t, ok)
	require.EqualValues(t, 3, last)

	// After a reset the next sequenced event is the new baseline.
	ix.ResetWorker(wk(1))
	_, ok = ix.LastEventID(wk(1))
	require.False(t, ok)
	require.NoError(t, ix.Apply(stored(wk(1), 100, 0, 0, []H{1}, prompt(1))))
	require.NoError(t, ix.Apply(stored(wk(1), 0, 0, 1, []H{2}, prompt(2))), "unsequenced events skip the checks")
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{wk(1): dev(2)}, matchMap(ix, prompt(1, 2)))
	st := ix.Stats()
	require.EqualValues(t, 1, st.Gaps)
	require.EqualValues(t, 3, st.Applied)
}

func TestInvalidEvent(t *testing.T) {
	ix := newIndex(t)
	err := ix.Apply(&kvroute.Event{Kind: kvroute.EventStored, Worker: wk(1), Tier: 9})
	require.ErrorIs(t, err, kvroute.ErrInvalidEvent)
	err = ix.Apply(&kvroute.Event{Kind: 0, Worker: wk(1)})
	require.ErrorIs(t, err, kvroute.ErrInvalidEvent)
	require.EqualValues(t, 2, ix.Stats().Invalid)

	// A malformed event in sequence does not stall the worker's stream.
	require.NoError(t, ix.Apply(stored(wk(2), 1, 0, 0, []H{1}, prompt(1))))
	require.ErrorIs(t, ix.Apply(&kvroute.Event{Kind: kvroute.EventStored, Worker: wk(2), ID: 2, Tier: 9}), kvroute.ErrInvalidEvent)
	require.NoError(t, ix.Apply(stored(wk(2), 3, 0, 1, []H{2}, prompt(2))))
}

func TestTokensAreHashedWithLoRA(t *testing.T) {
	ix := newIndex(t)
	toks := prompt(1, 2)
	ev := &kvroute.Event{Kind: kvroute.EventStored, Worker: wk(1), LoRA: "adapter-a",
		Blocks: []kvroute.StoredBlock{{External: 1, Tokens: toks[:4]}, {External: 2, Tokens: toks[4:]}}}
	require.NoError(t, ix.Apply(ev))
	var res indexer.MatchResult
	ix.Match(seqsOf(toks), &res)
	require.Empty(t, res.Workers, "base-model prompt must not match adapter blocks")
	lora := testHasher.WithLoRA("adapter-a")
	ix.Match(lora.AppendSeqHashes(nil, toks), &res)
	require.Len(t, res.Workers, 1)
	require.Equal(t, 2, res.Workers[0].Blocks)
}

func TestRemoveWorkerAndSize(t *testing.T) {
	ix := newIndex(t)
	require.NoError(t, ix.Apply(stored(wk(1), 1, 0, 0, []H{11, 12}, prompt(1, 2))))
	require.NoError(t, ix.Apply(stored(wk(2), 1, 0, 0, []H{21, 22, 23}, prompt(1, 2, 3))))
	require.NoError(t, ix.Apply(stored(wk(2), 2, kvroute.TierHost, 0, []H{21}, prompt(1))))
	s := ix.Size()
	require.Equal(t, 2, s.Workers)
	require.Equal(t, 3, s.Blocks)
	require.Equal(t, 5, s.Pairs)
	require.Equal(t, 5, s.Entries)
	require.Positive(t, s.Bytes)

	require.True(t, ix.RemoveWorker(wk(2)))
	require.False(t, ix.RemoveWorker(wk(2)))
	s = ix.Size()
	require.Equal(t, indexer.Size{Workers: 1, Blocks: 2, Pairs: 2, Entries: 2, Bytes: s.Bytes}, s)
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{wk(1): dev(2)}, matchMap(ix, prompt(1, 2, 3)))
	require.Equal(t, []kvroute.WorkerKey{wk(1)}, ix.Workers())

	// The freed slot is reused by a new worker without stale bits.
	require.NoError(t, ix.Apply(stored(wk(3), 1, 0, 0, []H{31}, prompt(5))))
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{wk(1): dev(2)}, matchMap(ix, prompt(1, 2, 3)))
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{wk(3): dev(1)}, matchMap(ix, prompt(5)))

	require.NoError(t, ix.Apply(cleared(wk(1), 2)))
	ix.ResetWorker(wk(3))
	require.Equal(t, indexer.Size{Workers: 2, Bytes: ix.Size().Bytes}, ix.Size())
}

func TestManyWorkersBeyondOneChunk(t *testing.T) {
	ix := newIndex(t)
	const n = 200
	for i := range n {
		depth := 1 + i%5
		bases := []uint32{1, 2, 3, 4, 5}[:depth]
		ext := make([]H, depth)
		for j := range ext {
			ext[j] = H(i*10 + j + 1)
		}
		require.NoError(t, ix.Apply(stored(wk(uint64(i)), 1, kvroute.Tier(i%2), 0, ext, prompt(bases...))))
	}
	got := matchMap(ix, prompt(1, 2, 3, 4, 5))
	require.Len(t, got, n)
	for i := range n {
		var want [kvroute.NumTiers]int
		want[i%2] = 1 + i%5
		require.Equal(t, want, got[wk(uint64(i))], "worker %d", i)
	}
	var res indexer.MatchResult
	res.StopAtOne = true
	ix.Match(seqsOf(prompt(1, 2, 3, 4, 5)), &res)
	require.Equal(t, 5, res.Blocks)
	require.False(t, res.Truncated)
}

func TestStopAtOne(t *testing.T) {
	ix := newIndex(t)
	require.NoError(t, ix.Apply(stored(wk(1), 1, 0, 0, []H{1, 2, 3, 4}, prompt(1, 2, 3, 4))))
	require.NoError(t, ix.Apply(stored(wk(2), 1, 0, 0, []H{1}, prompt(1))))
	// Block 3 also in host memory: worker 1's blocks 2, 3 and 4 are three
	// runs, so the walk has runs left once worker 1 is alone after block 2.
	require.NoError(t, ix.Apply(stored(wk(1), 2, kvroute.TierHost, 2, []H{3}, prompt(3))))
	res := indexer.MatchResult{StopAtOne: true}
	ix.Match(seqsOf(prompt(1, 2, 3, 4)), &res)
	require.True(t, res.Truncated)
	m, ok := res.Find(wk(1))
	require.True(t, ok)
	require.Equal(t, 2, m.Blocks, "the walk stops once worker 1 is alone")
	_, ok = res.Find(wk(9))
	require.False(t, ok)
}

func TestMatchAllocatesNothing(t *testing.T) {
	ix := newIndex(t)
	for w := range 8 {
		require.NoError(t, ix.Apply(stored(wk(uint64(w)), 1, kvroute.Tier(w%3), 0, []H{1, 2, 3}, prompt(1, 2, 3))))
	}
	seqs := seqsOf(prompt(1, 2, 3, 4))
	var res indexer.MatchResult
	ix.Match(seqs, &res)
	allocs := testing.AllocsPerRun(100, func() { ix.Match(seqs, &res) })
	require.Zero(t, allocs)
	require.Len(t, res.Workers, 8)
}

// checkDumpRoundTrip rebuilds the index from its dump and compares. The
// rebuilt index hashes with another block size and namespace: the dump's
// Stored events carry sequence hashes, which it takes as they are.
func checkDumpRoundTrip(t *testing.T, ix *indexer.Index, tokens []uint32) {
	t.Helper()
	rebuilt, err := indexer.New(indexer.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 8, Namespace: "other"})})
	require.NoError(t, err)
	require.NoError(t, ix.Dump(func(ev *kvroute.Event) error {
		require.Zero(t, ev.ID)
		require.Equal(t, ev.Kind == kvroute.EventStored, ev.SeqHashes, "%v", ev)
		return rebuilt.Apply(ev)
	}))
	require.Equal(t, matchMap(ix, tokens), matchMap(rebuilt, tokens))
	orig, again := ix.Size(), rebuilt.Size()
	require.Equal(t, orig.Blocks, again.Blocks)
	require.Equal(t, orig.Pairs, again.Pairs)
	require.Equal(t, orig.Entries, again.Entries)
	require.Equal(t, ix.Workers(), rebuilt.Workers())
	for _, w := range ix.Workers() {
		require.ElementsMatch(t, ix.AppendWorkerBlocks(w, nil), rebuilt.AppendWorkerBlocks(w, nil))
	}
}

// TestDumpKeepsEmptyWorkers: a worker the index knows that holds no block
// (it cleared its cache, or evicted everything) is in the dump, so that the
// rebuilt index lists the same workers.
func TestDumpKeepsEmptyWorkers(t *testing.T) {
	ix := newIndex(t)
	a, b, c := wk(1), wk(2), wk(3)
	require.NoError(t, ix.Apply(stored(a, 1, 0, 0, []H{11, 12}, prompt(1, 2))))
	require.NoError(t, ix.Apply(stored(b, 1, 0, 0, []H{21}, prompt(1))))
	require.NoError(t, ix.Apply(removed(b, 2, 0, 21)))
	require.NoError(t, ix.Apply(cleared(c, 1)))
	require.Equal(t, []kvroute.WorkerKey{a, b, c}, ix.Workers())
	checkDumpRoundTrip(t, ix, prompt(1, 2))
}

// TestDumpWorker dumps one worker: its events alone, which rebuild its
// blocks; a known worker without blocks gives one Cleared event, an
// unknown one nothing.
func TestDumpWorker(t *testing.T) {
	ix := newIndex(t)
	a, b, c := wk(1), wk(2), wk(3)
	require.NoError(t, ix.Apply(stored(a, 1, 0, 0, []H{11, 12}, prompt(1, 2))))
	require.NoError(t, ix.Apply(stored(b, 1, 0, 0, []H{21, 22, 23}, prompt(1, 2, 3))))
	require.NoError(t, ix.Apply(removed(b, 2, 0, 21)))
	require.NoError(t, ix.Apply(cleared(c, 1)))

	rebuilt := newIndex(t)
	var kinds []kvroute.EventKind
	require.NoError(t, ix.DumpWorker(b, func(ev *kvroute.Event) error {
		require.Equal(t, b, ev.Worker)
		kinds = append(kinds, ev.Kind)
		return rebuilt.Apply(ev)
	}))
	require.NotEmpty(t, kinds)
	require.Equal(t, []kvroute.WorkerKey{b}, rebuilt.Workers())
	require.ElementsMatch(t, ix.AppendWorkerBlocks(b, nil), rebuilt.AppendWorkerBlocks(b, nil))
	require.Equal(t, matchMap(ix, prompt(1, 2, 3))[b], matchMap(rebuilt, prompt(1, 2, 3))[b])

	kinds = nil
	require.NoError(t, ix.DumpWorker(c, func(ev *kvroute.Event) error {
		kinds = append(kinds, ev.Kind)
		return rebuilt.Apply(ev)
	}))
	require.Equal(t, []kvroute.EventKind{kvroute.EventCleared}, kinds)
	require.Equal(t, []kvroute.WorkerKey{b, c}, rebuilt.Workers())

	require.NoError(t, ix.DumpWorker(wk(9), func(ev *kvroute.Event) error {
		t.Fatalf("unknown worker dumped %v", ev)
		return nil
	}))
}

// TestApplySeqHashes: a Stored event of sequence hashes stores the same
// blocks as the event of content hashes (or tokens) they chain from,
// under a parent and at the root, whatever the index's Hasher and the
// event's LoRA name; later events build on them as on any block.
func TestApplySeqHashes(t *testing.T) {
	a := wk(1)
	byContent := newIndex(t)
	require.NoError(t, byContent.Apply(stored(a, 1, 0, 0, []H{11, 12}, prompt(1, 2))))
	require.NoError(t, byContent.Apply(stored(a, 2, 0, 12, []H{13, 14}, prompt(3, 4))))

	bySeq, err := indexer.New(indexer.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4, Namespace: "other"})})
	require.NoError(t, err)
	seqs := seqsOf(prompt(1, 2, 3, 4))
	ev := func(id uint64, parent H, ext []H, seqs []kvroute.SeqHash) *kvroute.Event {
		e := &kvroute.Event{Kind: kvroute.EventStored, Worker: a, ID: id, HasParent: parent != 0, Parent: parent,
			SeqHashes: true, LoRA: "ignored"}
		for i, s := range seqs {
			e.Blocks = append(e.Blocks, kvroute.StoredBlock{External: ext[i], Hash: kvroute.BlockHash(s)})
		}
		return e
	}
	require.NoError(t, bySeq.Apply(ev(1, 0, []H{11, 12}, seqs[:2])))
	require.NoError(t, bySeq.Apply(ev(2, 12, []H{13, 14}, seqs[2:])))
	require.Equal(t, matchMap(byContent, prompt(1, 2, 3, 4)), matchMap(bySeq, prompt(1, 2, 3, 4)))
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(4)}, matchMap(bySeq, prompt(1, 2, 3, 4)))

	// A child stored by content under a block stored by sequence hash.
	for _, x := range []*indexer.Index{byContent, bySeq} {
		require.NoError(t, x.Apply(stored(a, 3, 0, 14, []H{15}, prompt(5))))
		require.NoError(t, x.Apply(removed(a, 4, 0, 12)))
	}
	require.Equal(t, matchMap(byContent, prompt(1, 2, 3, 4, 5)), matchMap(bySeq, prompt(1, 2, 3, 4, 5)))
	require.ElementsMatch(t, byContent.AppendWorkerBlocks(a, nil), bySeq.AppendWorkerBlocks(a, nil))

	bad := ev(5, 0, []H{21}, seqs[:1])
	bad.Blocks[0].Tokens = prompt(1)
	require.ErrorIs(t, bySeq.Apply(bad), kvroute.ErrInvalidEvent)
}

func TestDumpOrphanRoundTrip(t *testing.T) {
	ix := newIndex(t)
	a := wk(1)
	require.NoError(t, ix.Apply(stored(a, 1, 0, 0, []H{11, 12, 13}, prompt(1, 2, 3))))
	require.NoError(t, ix.Apply(removed(a, 2, 0, 11, 12)))
	checkDumpRoundTrip(t, ix, prompt(1, 2, 3))
	// Restoring the parents in both makes the orphan reachable again.
	rebuilt := newIndex(t)
	require.NoError(t, ix.Dump(rebuilt.Apply))
	for _, x := range []*indexer.Index{ix, rebuilt} {
		require.NoError(t, x.Apply(stored(a, 0, 0, 0, []H{11, 12}, prompt(1, 2))))
		require.NoError(t, x.Apply(stored(a, 0, 0, 12, []H{13}, prompt(3))))
	}
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(3)}, matchMap(rebuilt, prompt(1, 2, 3)))
	checkDumpRoundTrip(t, ix, prompt(1, 2, 3))
}

func TestDumpStopsAtError(t *testing.T) {
	ix := newIndex(t)
	require.NoError(t, ix.Apply(stored(wk(1), 1, 0, 0, []H{11, 12}, prompt(1, 2))))
	boom := errors.New("boom")
	calls := 0
	err := ix.Dump(func(*kvroute.Event) error { calls++; return boom })
	require.ErrorIs(t, err, boom)
	require.Equal(t, 1, calls)
}

// Dump calls fn without the index's lock: fn may apply events to the same
// index (a replica serving a dump while it ingests), and the dump is the
// snapshot taken before.
func TestDumpCallsFnUnlocked(t *testing.T) {
	ix := newIndex(t)
	a, b := wk(1), wk(2)
	require.NoError(t, ix.Apply(stored(a, 1, 0, 0, []H{11, 12}, prompt(1, 2))))
	require.NoError(t, ix.Apply(stored(b, 1, 0, 0, []H{21}, prompt(1))))
	rebuilt := newIndex(t)
	applied := false
	require.NoError(t, ix.Dump(func(ev *kvroute.Event) error {
		if !applied {
			applied = true
			require.NoError(t, ix.Apply(stored(a, 2, 0, 12, []H{13}, prompt(3))))
			require.NoError(t, ix.Apply(stored(b, 2, 0, 21, []H{22}, prompt(2))))
		}
		return rebuilt.Apply(ev)
	}))
	require.True(t, applied)
	// Worker a's snapshot was taken before the store of block 13; worker
	// b's after the store of block 22.
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(2), b: dev(2)}, matchMap(rebuilt, prompt(1, 2, 3)))
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(3), b: dev(2)}, matchMap(ix, prompt(1, 2, 3)))
}

func TestEvictedBlocksLeaveTheIndex(t *testing.T) {
	ix := newIndex(t)
	w := wk(1)
	const n = 5000
	ext := make([]H, n)
	var bases []uint32
	for i := range ext {
		ext[i] = H(i + 1)
		bases = append(bases, uint32(i))
	}
	toks := prompt(bases...)
	require.NoError(t, ix.Apply(stored(w, 0, 0, 0, ext, toks)))
	full := ix.Size()
	require.Equal(t, n, full.Blocks)

	// Evict and store the tail again.
	require.NoError(t, ix.Apply(removed(w, 0, 0, ext[n-10:]...)))
	require.Equal(t, n-10, ix.Size().Blocks)
	require.NoError(t, ix.Apply(stored(w, 0, 0, ext[n-11], ext[n-10:], toks[(n-10)*4:])))
	again := ix.Size()
	require.Equal(t, full.Blocks, again.Blocks)
	require.Equal(t, full.Pairs, again.Pairs)
	require.Equal(t, full.Entries, again.Entries)
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{w: dev(n)}, matchMap(ix, toks))

	// Evict one block in the middle: the blocks after it stay indexed but
	// unreachable until it returns.
	require.NoError(t, ix.Apply(removed(w, 0, 0, ext[100])))
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{w: dev(100)}, matchMap(ix, toks))
	require.Equal(t, n-1, ix.Size().Blocks)
	require.NoError(t, ix.Apply(stored(w, 0, 0, ext[99], ext[100:101], toks[400:404])))
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{w: dev(n)}, matchMap(ix, toks))

	// Evicting everything frees the blocks' memory.
	require.NoError(t, ix.Apply(removed(w, 0, 0, ext...)))
	s := ix.Size()
	require.Zero(t, s.Blocks)
	require.Zero(t, s.Pairs)
	require.Less(t, s.Bytes, full.Bytes/2)
	var res indexer.MatchResult
	ix.Match(seqsOf(toks), &res)
	require.Empty(t, res.Workers)
	require.NoError(t, ix.Apply(stored(w, 0, 0, 0, ext[:3], toks[:12])))
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{w: dev(3)}, matchMap(ix, toks))
}

func TestLastUpdate(t *testing.T) {
	clock := clocktest.New(time.Unix(500, 0))
	ix, err := indexer.New(indexer.Config{Hasher: testHasher, Clock: clock})
	require.NoError(t, err)
	_, ok := ix.LastUpdate(wk(1))
	require.False(t, ok)
	require.NoError(t, ix.Apply(stored(wk(1), 1, 0, 0, []H{1}, prompt(1))))
	clock.Advance(time.Second)
	at, ok := ix.LastUpdate(wk(1))
	require.True(t, ok)
	require.Equal(t, time.Unix(500, 0), at)
}

// TestDeadRunStartStaysFindable removes the first block of a chain while
// its child stays held: the run's start dies and is swept from the table.
// It must stay findable, so that storing the chain again brings the first
// block back in place instead of indexing the second twice.
func TestDeadRunStartStaysFindable(t *testing.T) {
	ix := newIndex(t)
	indexer.SetSweepMin(ix, 1) // sweep dead run starts at once
	w := wk(1)
	toks := prompt(1, 2)
	require.NoError(t, ix.Apply(stored(w, 1, kvroute.TierDevice, 0, []H{5, 6}, toks)))
	require.NoError(t, ix.Apply(removed(w, 2, kvroute.TierDevice, 5)))
	require.Equal(t, 1, ix.Size().Pairs)
	require.NoError(t, ix.Apply(stored(w, 3, kvroute.TierDevice, 0, []H{7, 8}, toks)))
	size := ix.Size()
	require.Equal(t, 2, size.Blocks)
	require.Equal(t, 2, size.Pairs)
	require.Equal(t, 3, size.Entries)

	var res indexer.MatchResult
	ix.Match(seqsOf(toks), &res)
	m, ok := res.Find(w)
	require.True(t, ok)
	require.Equal(t, 2, m.Blocks)

	// Removing one engine hash of the second block keeps it held.
	require.NoError(t, ix.Apply(removed(w, 4, kvroute.TierDevice, 8)))
	ix.Match(seqsOf(toks), &res)
	m, _ = res.Find(w)
	require.Equal(t, 2, m.Blocks)
	require.Equal(t, 2, ix.Size().Pairs)
}

// TestRepeatedBlockCutsEventShort: a Stored event whose block names an
// engine hash the event named already, as its parent or an earlier block
// (a block its own ancestor), is cut short there: the blocks before it
// are stored, it and those after it are not, the worker keeps every block
// it held, and the event's ID is consumed.
func TestRepeatedBlockCutsEventShort(t *testing.T) {
	long := make([]H, 20)
	for i := range long {
		long[i] = H(100 + i)
	}
	repeatLong := slices.Clone(long)
	repeatLong[17] = long[3]
	zeros := slices.Clone(long)
	zeros[2], zeros[11] = 0, 0
	tests := []struct {
		name   string
		parent H
		ext    []H
		stored int
	}{
		{"parent again", 50, []H{50}, 0},
		{"parent again later", 50, []H{60, 61, 50}, 2},
		{"parent again, many blocks", 50, append(slices.Clone(long), 50, 62), 20},
		{"a block twice", 0, []H{60, 61, 60}, 2},
		{"a block twice, adjacent", 50, []H{60, 60}, 1},
		{"a block twice, many blocks", 0, repeatLong, 17},
		{"hash zero twice", 0, zeros, 11},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := newIndex(t)
			w := wk(1)
			parentToks := prompt(90)
			require.NoError(t, ix.Apply(stored(w, 1, kvroute.TierDevice, 0, []H{50}, parentToks)))
			toks := make([]uint32, 0, 4*len(tt.ext))
			for i := range tt.ext {
				toks = append(toks, prompt(uint32(i+1))...)
			}
			full := toks
			if tt.parent != 0 {
				full = append(slices.Clone(parentToks), toks...)
			}
			err := ix.Apply(stored(w, 2, kvroute.TierDevice, tt.parent, tt.ext, toks))
			require.ErrorIs(t, err, indexer.ErrRepeatedBlock)
			var re *indexer.RepeatedBlockError
			require.ErrorAs(t, err, &re)
			require.Equal(t, tt.stored, re.Stored)
			require.Equal(t, uint64(1), ix.Stats().Repeated)

			var res indexer.MatchResult
			ix.Match(seqsOf(parentToks), &res)
			m, ok := res.Find(w)
			require.True(t, ok, "the parent block is gone")
			require.Equal(t, 1, m.Blocks)
			want := tt.stored
			if tt.parent != 0 {
				want++
			}
			ix.Match(seqsOf(full), &res)
			m, _ = res.Find(w)
			require.Equal(t, want, m.Blocks)
			require.Equal(t, 1+tt.stored, ix.Size().Pairs)

			// The event's ID was consumed: the next one applies.
			require.NoError(t, ix.Apply(stored(w, 3, kvroute.TierDevice, 50, []H{70}, prompt(91))))
		})
	}
	// Distinct hashes, the hash 0 among them once, are stored.
	ix := newIndex(t)
	ok := slices.Clone(long)
	ok[5] = 0
	toks := make([]uint32, 0, 4*len(ok))
	for i := range ok {
		toks = append(toks, prompt(uint32(i+1))...)
	}
	require.NoError(t, ix.Apply(stored(wk(1), 1, kvroute.TierDevice, 0, ok, toks)))
	require.Equal(t, len(ok), ix.Size().Pairs)
}

// TestRemoveChainStretches removes stretches of one worker's chain in one
// event, in the orders engines evict them (tail first, head first) and
// across the segments another worker's shorter hold splits the chain into.
func TestRemoveChainStretches(t *testing.T) {
	a, b := wk(1), wk(2)
	const n = 8
	toks := prompt(0, 1, 2, 3, 4, 5, 6, 7)
	extA := make([]H, n)
	for i := range extA {
		extA[i] = H(i + 1)
	}
	extB := []H{101, 102, 103, 104}
	for _, c := range []struct {
		name   string
		remove []H
		want   map[kvroute.WorkerKey][kvroute.NumTiers]int
		blocks int
		pairs  int
	}{
		{"tail first", []H{8, 7, 6, 5, 4, 3, 2, 1}, map[kvroute.WorkerKey][kvroute.NumTiers]int{b: dev(4)}, 4, 4},
		{"head first", []H{1, 2, 3, 4, 5, 6, 7, 8}, map[kvroute.WorkerKey][kvroute.NumTiers]int{b: dev(4)}, 4, 4},
		{"middle, across segments", []H{6, 5, 4, 3}, map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(2), b: dev(4)}, 6, 8},
		{"tail, then an unknown hash, then the head", []H{8, 7, 999, 1, 2}, map[kvroute.WorkerKey][kvroute.NumTiers]int{b: dev(4)}, 6, 8},
		{"interleaved ends", []H{8, 1, 7, 2}, map[kvroute.WorkerKey][kvroute.NumTiers]int{b: dev(4)}, 6, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			ix := newIndex(t)
			require.NoError(t, ix.Apply(stored(a, 0, 0, 0, extA, toks)))
			require.NoError(t, ix.Apply(stored(b, 0, 0, 0, extB, toks[:16])))
			require.NoError(t, ix.Apply(removed(a, 0, 0, c.remove...)))
			require.Equal(t, c.want, matchMap(ix, toks))
			s := ix.Size()
			require.Equal(t, c.blocks, s.Blocks)
			require.Equal(t, c.pairs, s.Pairs)

			// Storing the removed blocks again restores the whole chain.
			require.NoError(t, ix.Apply(removed(a, 0, 0, extA...)))
			require.NoError(t, ix.Apply(stored(a, 0, 0, 0, extA, toks)))
			require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{a: dev(n), b: dev(4)}, matchMap(ix, toks))
			s = ix.Size()
			require.Equal(t, n, s.Blocks)
			require.Equal(t, n+4, s.Pairs)
		})
	}
}

// TestWorkerBeyondFirstChunkAcrossTiers: a worker in slot 64 holds a
// block in the host tier and its child in the device tier, inside a
// stretch whose segments another worker's adds and drops left with the
// same holders (see also TestHoldersDifferBeyondFirstChunk); what it holds
// and the pair counts follow its events.
func TestWorkerBeyondFirstChunkAcrossTiers(t *testing.T) {
	h, b, w := wk(1), wk(2), wk(3)
	ix := newIndex(t)
	toks := prompt(1, 2, 3)
	require.NoError(t, ix.Apply(stored(h, 0, 0, 0, []H{11, 12, 13}, toks)))
	require.NoError(t, ix.Apply(stored(b, 0, 0, 0, []H{21, 22}, toks[:8])))
	require.NoError(t, ix.Apply(removed(b, 0, 0, 21)))
	require.NoError(t, ix.Apply(removed(b, 0, 0, 22)))
	for i := range 62 { // fill the first chunk's slots: w gets slot 64
		require.NoError(t, ix.Apply(cleared(wk(uint64(100+i)), 0)))
	}
	require.NoError(t, ix.Apply(stored(w, 0, kvroute.TierHost, 0, []H{31}, toks[:4])))
	require.NoError(t, ix.Apply(stored(w, 0, kvroute.TierDevice, 31, []H{32}, toks[4:8])))
	require.NoError(t, ix.Apply(removed(w, 0, kvroute.TierHost, 31)))
	require.Equal(t, 3+1, ix.Size().Pairs)
	// With the first block stored again, w holds the first two.
	require.NoError(t, ix.Apply(stored(w, 0, 0, 0, []H{33}, toks[:4])))
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{h: dev(3), w: dev(2)}, matchMap(ix, toks))
	require.Equal(t, 3+2, ix.Size().Pairs)
	require.NoError(t, ix.Apply(cleared(w, 0)))
	require.Equal(t, map[kvroute.WorkerKey][kvroute.NumTiers]int{h: dev(3)}, matchMap(ix, toks))
	require.Equal(t, 3, ix.Size().Pairs)
}

// TestReserveWorker checks where a domain's reservation comes from and
// when it goes away, and that an index with room reserved, before and
// after its workers' first events, answers as one without.
func TestReserveWorker(t *testing.T) {
	ix, err := indexer.New(indexer.Config{Hasher: testHasher, WorkerBlocks: 100})
	require.NoError(t, err)
	plain := newIndex(t)
	require.Equal(t, 100, ix.Reservation(wk(1)), "Config.WorkerBlocks")
	ix.ReserveWorker(wk(2), 5000)
	require.Equal(t, 5000, ix.Reservation(wk(2)), "reserved before the worker is known")
	require.Equal(t, []kvroute.WorkerKey(nil), ix.Workers(), "a reservation registers no worker")

	events := []*kvroute.Event{
		stored(wk(1), 1, 0, 0, []H{11, 12, 13}, prompt(1, 2, 3)),
		stored(wk(2), 1, 0, 0, []H{21, 22}, prompt(1, 2)),
		removed(wk(1), 2, 0, 12),
		stored(wk(3), 1, 0, 0, []H{31}, prompt(7)),
	}
	for i, ev := range events {
		require.NoError(t, ix.Apply(ev))
		require.NoError(t, plain.Apply(ev))
		if i == 1 {
			ix.ReserveWorker(wk(1), 20000) // the map grows with entries in it
		}
	}
	require.Equal(t, 20000, ix.Reservation(wk(1)))
	for _, p := range [][]uint32{prompt(1, 2, 3), prompt(7), prompt(1)} {
		require.Equal(t, matchMap(plain, p), matchMap(ix, p))
	}
	require.Equal(t, plain.Size().Pairs, ix.Size().Pairs)

	ix.ReserveWorker(wk(1), 0)
	require.Equal(t, 100, ix.Reservation(wk(1)), "cancelled: Config.WorkerBlocks again")
	require.True(t, ix.RemoveWorker(wk(2)))
	require.Equal(t, 100, ix.Reservation(wk(2)), "RemoveWorker cancels the reservation")
	ix.ReserveWorker(wk(9), 50)
	require.False(t, ix.RemoveWorker(wk(9)))
	require.Equal(t, 100, ix.Reservation(wk(9)), "also of a worker the index never saw")
}
