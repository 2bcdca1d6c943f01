package indexer_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/internal/clocktest"
)

// seqModel is the plain reference for one worker's event sequence.
type seqModel struct {
	known     bool // the index has the worker
	last      uint64
	sequenced bool
}

// expect returns what Apply must answer for ev, a Stored event's unknown
// parent aside, and moves s on as the index must.
func (s *seqModel) expect(ev *kvroute.Event) error {
	if err := ev.Validate(); err != nil {
		if ev.ID != 0 && s.known && s.sequenced && ev.ID == s.last+1 {
			s.last = ev.ID
		}
		return kvroute.ErrInvalidEvent
	}
	s.known = true
	if ev.ID != 0 && s.sequenced {
		switch {
		case ev.ID <= s.last:
			return indexer.ErrDuplicate
		case ev.ID > s.last+1:
			return indexer.ErrGap
		}
	}
	if ev.ID != 0 {
		s.last, s.sequenced = ev.ID, true
	}
	return nil
}

// historyWorker is a worker of TestRandomizedHistories with its models.
type historyWorker struct {
	key  kvroute.WorkerKey
	m    *model
	seq  seqModel
	doc  *docWorker
	next kvroute.ExternalHash
	// updated is when an event of the worker was last applied; zero for
	// none.
	updated time.Time
}

// TestRandomizedHistories drives one index through long random histories
// of a few workers (some in slots beyond the first 64-slot chunk, some
// ranks of one data-parallel worker) that the concurrent model test does
// not reach: events in every tier, engine hashes reused for the same and
// for other blocks, duplicated and skipped event IDs, malformed events in
// and out of sequence, unsequenced events, worker resets, worker removals
// with the key coming back in a reused slot, and Dump/restore in the
// middle of the history, after which the history goes on in the restored
// index. After every few operations each worker's engine-hash map, the
// holder bits, every size counter, the event statistics, each worker's
// last event ID and last update are compared with the models and the
// sizes recounted from the index's structures; at the end of every trial,
// and after every restore, every probe's match (and its StopAtOne match)
// is compared too.
func TestRandomizedHistories(t *testing.T) {
	trials := 60
	if testing.Short() {
		trials = 10
	}
	probeSet := probes()
	for trial := range trials {
		if err := runHistory(uint64(trial), 400, probeSet, trial%4 == 0); err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
	}
}

// runHistory runs one random history of ops operations from seed and
// returns the first disagreement with the models. With concurrent set,
// two readers match probes and dump the index into fresh ones while the
// history runs, and check what they get for consistency.
func runHistory(seed uint64, ops int, probeSet [][]kvroute.SeqHash, concurrent bool) (err error) {
	r := rand.New(rand.NewPCG(seed, 44))
	clock := clocktest.New(time.Unix(1000, 0))
	ix, err := indexer.New(indexer.Config{Hasher: testHasher, Clock: clock})
	if err != nil {
		return err
	}
	var current atomic.Pointer[indexer.Index] // ix, for the readers
	current.Store(ix)
	if concurrent {
		var stop atomic.Bool
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for reader := range errs {
			wg.Go(func() { errs[reader] = readWhileWriting(&current, &stop, probeSet, reader) })
		}
		defer func() {
			stop.Store(true)
			wg.Wait()
			err = errors.Join(append([]error{err}, errs...)...)
		}()
	}
	indexer.SetSweepMin(ix, 1+r.IntN(8))
	// Fillers take the first slots, so that the workers under test sit on
	// both sides of a chunk boundary; some fillers leave again later.
	fillers := r.IntN(2) * (60 + r.IntN(10))
	for id := range fillers {
		if err := ix.Apply(cleared(wk(uint64(1000+id)), 0)); err != nil {
			return err
		}
	}
	stats := ix.Stats() // as the models count them
	var workers []*historyWorker
	for i := range 3 + r.IntN(4) {
		key := kvroute.WorkerKey{ID: kvroute.WorkerID(1 + i%3), Rank: kvroute.DPRank(i / 3)} // ranks of data-parallel workers
		workers = append(workers, &historyWorker{key: key, m: newModel(), doc: &docWorker{ext: map[[2]int]kvroute.ExternalHash{}},
			next: kvroute.ExternalHash(i+1) << 40})
	}
	models := func() map[kvroute.WorkerKey]*model {
		out := map[kvroute.WorkerKey]*model{}
		for _, w := range workers {
			if w.seq.known {
				out[w.key] = w.m
			}
		}
		return out
	}
	check := func(at string, probe bool) error {
		if err := heldMismatch(ix, models()); err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
		if err := indexer.Recount(ix); err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
		entries := 0
		for _, w := range workers {
			got := indexer.WorkerEntries(ix, w.key)
			if !w.seq.known {
				if got != nil {
					return fmt.Errorf("%s: removed worker %v is known", at, w.key)
				}
				continue
			}
			if got == nil {
				return fmt.Errorf("%s: worker %v is unknown", at, w.key)
			}
			entries += len(w.m.blocks)
			if len(got) != len(w.m.blocks) {
				return fmt.Errorf("%s: worker %v holds %d engine hashes, model %d", at, w.key, len(got), len(w.m.blocks))
			}
			for h, e := range w.m.blocks {
				if g := got[h]; g.Seq != e.seq || g.Tiers != e.tiers {
					return fmt.Errorf("%s: worker %v holds %#x as %#x in tiers %04b, model %#x in %04b", at, w.key, uint64(h), uint64(g.Seq), g.Tiers, uint64(e.seq), e.tiers)
				}
			}
			if upd, ok := ix.LastUpdate(w.key); ok != !w.updated.IsZero() || !upd.Equal(w.updated) {
				return fmt.Errorf("%s: worker %v last updated %v (%v), model %v", at, w.key, upd, ok, w.updated)
			}
			last, ok := ix.LastEventID(w.key)
			if ok != w.seq.sequenced || (ok && last != w.seq.last) {
				return fmt.Errorf("%s: worker %v last event %d (%v), model %d (%v)", at, w.key, last, ok, w.seq.last, w.seq.sequenced)
			}
		}
		if got := ix.Stats(); got != stats {
			return fmt.Errorf("%s: stats %+v, models %+v", at, got, stats)
		}
		if n := ix.Size().Entries; n != entries {
			return fmt.Errorf("%s: %d entries, models %d", at, n, entries)
		}
		if !probe {
			return nil
		}
		var res indexer.MatchResult
		one := indexer.MatchResult{StopAtOne: true}
		for _, p := range probeSet {
			ix.Match(p, &res)
			for _, w := range workers {
				byTier, depth := w.m.match(p)
				got, ok := res.Find(w.key)
				if ok != (depth > 0) || got.Blocks != depth || (ok && got.ByTier != byTier) {
					return fmt.Errorf("%s: worker %v on a %d-block prompt: index %+v (found %v), model %d blocks %v", at, w.key, len(p), got, ok, depth, byTier)
				}
			}
			if err := checkStopAtOne(ix, p, &res, &one); err != nil {
				return fmt.Errorf("%s: %w", at, err)
			}
		}
		return nil
	}

	for op := range ops {
		clock.Advance(time.Millisecond)
		w := workers[r.IntN(len(workers))]
		at := fmt.Sprintf("op %d", op)
		switch p := r.IntN(100); {
		case p < 2:
			ix.ResetWorker(w.key)
			if w.seq.known {
				clear(w.m.blocks)
				w.seq.last, w.seq.sequenced = 0, false
			}
		case p < 4:
			if got := ix.RemoveWorker(w.key); got != w.seq.known {
				return fmt.Errorf("%s: RemoveWorker(%v) = %v, model %v", at, w.key, got, w.seq.known)
			}
			clear(w.m.blocks)
			w.seq = seqModel{}
			w.updated = time.Time{}
		case p < 5 && fillers > 0:
			// A filler leaves, freeing a low slot for a worker that
			// comes back.
			ix.RemoveWorker(wk(uint64(1000 + r.IntN(fillers))))
		case p < 6:
			// Dump and restore, and go on with the restored index, whose
			// workers are unsequenced.
			rebuilt, err := indexer.New(indexer.Config{Hasher: testHasher, Clock: clock})
			if err != nil {
				return err
			}
			indexer.SetSweepMin(rebuilt, 1+r.IntN(8))
			if err := ix.Dump(func(ev *kvroute.Event) error {
				if err := rebuilt.Apply(ev); err != nil {
					return fmt.Errorf("restoring %v: %w", ev, err)
				}
				return nil
			}); err != nil {
				return fmt.Errorf("%s: dump: %w", at, err)
			}
			ix = rebuilt
			current.Store(ix)
			for _, w := range workers {
				// Every known worker is restored, those holding no
				// block by a Cleared event.
				w.seq.last, w.seq.sequenced = 0, false
				w.updated = time.Time{}
				if w.seq.known {
					w.updated = clock.Now()
				}
			}
			// The restore applied only Stored, Removed and Cleared
			// events that name blocks and workers the index holds.
			stats = rebuilt.Stats()
			if stats.Applied == 0 && ix.Size().Pairs > 0 || stats != (indexer.Stats{Applied: stats.Applied}) {
				return fmt.Errorf("%s: restored with stats %+v", at, stats)
			}
			if err := check(at+" (restored)", true); err != nil {
				return err
			}
		case p < 10:
			// A malformed event, in sequence or not.
			id := w.seq.last + 1
			if r.IntN(3) == 0 {
				id = w.seq.last + 2
			}
			ev := &kvroute.Event{Kind: kvroute.EventStored, Worker: w.key, ID: id, Tier: kvroute.NumTiers}
			want := w.seq.expect(ev)
			stats.Invalid++
			if err := ix.Apply(ev); !errors.Is(err, want) {
				return fmt.Errorf("%s: malformed %v: %v, want %v", at, ev, err, want)
			}
		default:
			id := w.seq.last + 1
			switch q := r.IntN(20); {
			case q == 0:
				id = 0 // unsequenced
			case q == 1 && w.seq.last > 0:
				id = w.seq.last - uint64(r.IntN(int(min(w.seq.last, 3)))) // a duplicate
			case q == 2:
				id += 1 + uint64(r.IntN(3)) // a gap
			}
			var ev *kvroute.Event
			if r.IntN(2) == 0 {
				ev = randomEvent(r, w.key, id, w.m, &w.next)
			} else {
				ev = docEvent(r, w.key, id, w.m, w.doc, &w.next)
			}
			ev.Tier = kvroute.Tier(r.IntN(int(kvroute.NumTiers)))
			want := w.seq.expect(ev)
			unknownParent := ev.Kind == kvroute.EventStored && ev.HasParent && w.m.blocks[ev.Parent].tiers == 0
			switch {
			case want == nil && unknownParent:
				want = indexer.ErrUnknownParent
			case want == nil && repeatsBlock(ev):
				want = indexer.ErrRepeatedBlock
			}
			err := ix.Apply(ev)
			if (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) {
				return fmt.Errorf("%s: %v: %v, want %v", at, ev, err, want)
			}
			switch want {
			case indexer.ErrRepeatedBlock:
				stats.Applied++
				stats.Repeated++
				w.updated = clock.Now()
				w.m.apply(ev)
			case indexer.ErrDuplicate:
				stats.Duplicates++
			case indexer.ErrGap:
				stats.Gaps++
			case indexer.ErrUnknownParent:
				stats.Applied++
				stats.UnknownParents++
				w.updated = clock.Now()
			case nil:
				stats.Applied++
				stats.UnknownRemoved += unknownRemoved(w.m, ev)
				w.updated = clock.Now()
				w.m.apply(ev)
			}
		}
		if op%8 == 0 {
			if err := check(at, false); err != nil {
				return err
			}
		}
	}
	return check("end", true)
}

// readWhileWriting matches probes in the index current names until stop,
// checking that every answer adds up, and (reader 0) now and then dumps
// the index into a fresh one and checks that the copy is consistent.
func readWhileWriting(current *atomic.Pointer[indexer.Index], stop *atomic.Bool, probeSet [][]kvroute.SeqHash, reader int) error {
	var res indexer.MatchResult
	for i := 0; !stop.Load(); i++ {
		ix := current.Load()
		p := probeSet[(i*7+reader)%len(probeSet)]
		ix.Match(p, &res)
		best := 0
		for _, m := range res.Workers {
			sum := 0
			for _, c := range m.ByTier {
				sum += c
			}
			if sum != m.Blocks || m.Blocks < 1 || m.Blocks > len(p) {
				return fmt.Errorf("inconsistent match %+v of a %d-block prompt", m, len(p))
			}
			best = max(best, m.Blocks)
		}
		if best != res.Blocks {
			return fmt.Errorf("match says %d blocks, its workers %d", res.Blocks, best)
		}
		if reader == 0 && i%64 == 0 {
			copied, err := indexer.New(indexer.Config{Hasher: testHasher})
			if err != nil {
				return err
			}
			if err := ix.Dump(copied.Apply); err != nil {
				return fmt.Errorf("dump while writing: %w", err)
			}
			if _, _, err := indexer.HeldBlocks(copied); err != nil {
				return fmt.Errorf("dumped while writing: %w", err)
			}
			if err := indexer.Recount(copied); err != nil {
				return fmt.Errorf("dumped while writing: %w", err)
			}
		}
	}
	return nil
}

// checkStopAtOne matches p with StopAtOne into one and compares it with
// full, p's match without: untruncated, the two are the same; truncated,
// one worker is left with a prefix of its full match (its tier counts as
// far as it went), and every other worker's match is its full one.
func checkStopAtOne(ix *indexer.Index, p []kvroute.SeqHash, full, one *indexer.MatchResult) error {
	ix.Match(p, one)
	if len(one.Workers) != len(full.Workers) {
		return fmt.Errorf("StopAtOne names %d workers, the full match %d", len(one.Workers), len(full.Workers))
	}
	cut := 0
	for _, m := range one.Workers {
		f, ok := full.Find(m.Worker)
		switch {
		case !ok:
			return fmt.Errorf("StopAtOne names worker %v, the full match does not", m.Worker)
		case m == f:
		case !one.Truncated || m.Blocks < 1 || m.Blocks >= f.Blocks:
			return fmt.Errorf("StopAtOne (truncated %v) has %+v, the full match %+v", one.Truncated, m, f)
		default:
			cut++
			sum := 0
			for t, c := range m.ByTier {
				if c > f.ByTier[t] {
					return fmt.Errorf("StopAtOne has %+v, more in tier %d than the full match %+v", m, t, f)
				}
				sum += c
			}
			if sum != m.Blocks {
				return fmt.Errorf("StopAtOne has %+v, whose tiers do not add up", m)
			}
		}
	}
	if cut > 1 {
		return fmt.Errorf("StopAtOne cut %d workers short", cut)
	}
	return nil
}

// unknownRemoved returns how many of the blocks a Removed event ev names
// the worker whose model is m does not hold in the event's tier when the
// event comes to it.
func unknownRemoved(m *model, ev *kvroute.Event) uint64 {
	if ev.Kind != kvroute.EventRemoved {
		return 0
	}
	n := uint64(0)
	gone := map[kvroute.ExternalHash]bool{}
	for _, h := range ev.Removed {
		if gone[h] || m.blocks[h].tiers&(1<<ev.Tier) == 0 {
			n++
		}
		gone[h] = true
	}
	return n
}
