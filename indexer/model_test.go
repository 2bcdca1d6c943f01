package indexer_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
)

// model is a plain reference for one worker's view: what the index must
// hold after the same events, written for clarity rather than speed.
type model struct {
	blocks map[kvroute.ExternalHash]modelEntry
}

type modelEntry struct {
	seq   kvroute.SeqHash
	tiers uint8
}

func newModel() *model { return &model{blocks: map[kvroute.ExternalHash]modelEntry{}} }

func (m *model) apply(ev *kvroute.Event) {
	switch ev.Kind {
	case kvroute.EventStored:
		var parent kvroute.SeqHash
		if ev.HasParent {
			e, ok := m.blocks[ev.Parent]
			if !ok {
				return
			}
			parent = e.seq
		}
		for i, b := range ev.Blocks[:storedBlocks(ev)] {
			seq := kvroute.SeqHash(b.Hash)
			if ev.HasParent || i > 0 {
				seq = kvroute.NextSeqHash(parent, b.Hash)
			}
			old, ok := m.blocks[b.External]
			if ok && old.seq != seq {
				old = modelEntry{}
			}
			m.blocks[b.External] = modelEntry{seq: seq, tiers: old.tiers | 1<<ev.Tier}
			parent = seq
		}
	case kvroute.EventRemoved:
		for _, h := range ev.Removed {
			e, ok := m.blocks[h]
			if !ok {
				continue
			}
			e.tiers &^= 1 << ev.Tier
			if e.tiers == 0 {
				delete(m.blocks, h)
			} else {
				m.blocks[h] = e
			}
		}
	case kvroute.EventCleared:
		clear(m.blocks)
	}
}

// seqHashes returns a copy of the Stored event ev whose blocks carry
// their sequence hashes (kvroute.Event.SeqHashes), chained from the
// parent's as m knows it; ev itself when m does not know its parent.
func (m *model) seqHashes(ev *kvroute.Event) *kvroute.Event {
	var parent kvroute.SeqHash
	if ev.HasParent {
		e, ok := m.blocks[ev.Parent]
		if !ok {
			return ev
		}
		parent = e.seq
	}
	out := *ev
	out.SeqHashes = true
	out.Blocks = slices.Clone(ev.Blocks)
	for i := range out.Blocks {
		seq := kvroute.SeqHash(out.Blocks[i].Hash)
		if ev.HasParent || i > 0 {
			seq = kvroute.NextSeqHash(parent, out.Blocks[i].Hash)
		}
		out.Blocks[i].Hash = kvroute.BlockHash(seq)
		parent = seq
	}
	return &out
}

func (m *model) match(seqs []kvroute.SeqHash) (byTier [kvroute.NumTiers]int, depth int) {
	return matchTiers(m.tiersBySeq(), seqs)
}

// tiersBySeq returns, per block the worker holds, its tiers.
func (m *model) tiersBySeq() map[kvroute.SeqHash]uint8 {
	out := make(map[kvroute.SeqHash]uint8, len(m.blocks))
	for _, e := range m.blocks {
		out[e.seq] |= e.tiers
	}
	return out
}

// matchTiers is the model's match: leading blocks held, by fastest tier.
func matchTiers(tiers map[kvroute.SeqHash]uint8, seqs []kvroute.SeqHash) (byTier [kvroute.NumTiers]int, depth int) {
	for _, s := range seqs {
		t := tiers[s]
		if t == 0 {
			break
		}
		for tier := range kvroute.NumTiers {
			if t&(1<<tier) != 0 {
				byTier[tier]++
				break
			}
		}
		depth++
	}
	return byTier, depth
}

// storedBlocks returns how many blocks of a Stored event the index
// stores: those before the first that names an engine hash the event
// named already (as its parent or an earlier block).
func storedBlocks(ev *kvroute.Event) int {
	seen := map[kvroute.ExternalHash]bool{}
	if ev.HasParent {
		seen[ev.Parent] = true
	}
	for i, b := range ev.Blocks {
		if seen[b.External] {
			return i
		}
		seen[b.External] = true
	}
	return len(ev.Blocks)
}

// repeatsBlock reports whether the index cuts a Stored event short.
func repeatsBlock(ev *kvroute.Event) bool {
	return ev.Kind == kvroute.EventStored && storedBlocks(ev) < len(ev.Blocks)
}

// randomEvent makes a plausible event for a worker whose state is m.
func randomEvent(r *rand.Rand, w kvroute.WorkerKey, id uint64, m *model, nextExt *kvroute.ExternalHash) *kvroute.Event {
	tier := kvroute.Tier(r.IntN(3) * r.IntN(2))
	switch p := r.IntN(100); {
	case p < 60:
		// Store a chain under a held parent or at the root. Contents come
		// from a small alphabet so that workers share prefixes.
		ev := &kvroute.Event{Kind: kvroute.EventStored, Worker: w, ID: id, Tier: tier}
		if len(m.blocks) > 0 && r.IntN(3) > 0 {
			for h := range m.blocks {
				ev.HasParent, ev.Parent = true, h
				break
			}
		}
		if r.IntN(20) == 0 {
			ev.HasParent, ev.Parent = true, 1<<60 // unknown parent
		}
		for range 1 + r.IntN(6) {
			var ext kvroute.ExternalHash
			switch reuse := r.IntN(20); {
			case reuse == 0 && len(ev.Blocks) > 0:
				// Repeat the previous block's engine hash: a block its
				// own parent, where the index cuts the event short.
				ext = ev.Blocks[len(ev.Blocks)-1].External
			case reuse == 1 && ev.HasParent:
				ext = ev.Parent // the same with the event's parent
			case reuse == 2 && len(m.blocks) > 0:
				for h := range m.blocks { // reuse an engine hash
					ext = h
					break
				}
			default:
				*nextExt++
				ext = *nextExt
			}
			base := uint32(r.IntN(probeAlphabet))
			ev.Blocks = append(ev.Blocks, kvroute.StoredBlock{External: ext, Hash: testHasher.HashBlock(prompt(base))})
		}
		return ev
	case p < 95:
		ev := &kvroute.Event{Kind: kvroute.EventRemoved, Worker: w, ID: id, Tier: tier}
		for h := range m.blocks {
			ev.Removed = append(ev.Removed, h)
			if r.IntN(2) == 0 {
				break
			}
		}
		ev.Removed = append(ev.Removed, 1<<61) // unknown
		return ev
	default:
		return &kvroute.Event{Kind: kvroute.EventCleared, Worker: w, ID: id}
	}
}

// Random chains are drawn from probeAlphabet block contents, so that
// workers share prefixes; probes cover every prompt up to probeDepth.
const (
	probeAlphabet = 3
	probeDepth    = 6
)

// probes returns every prompt over the alphabet up to probeDepth.
func probes() [][]kvroute.SeqHash {
	var out [][]kvroute.SeqHash
	var rec func(prefix []uint32)
	rec = func(prefix []uint32) {
		if len(prefix) > 0 {
			out = append(out, seqsOf(prompt(prefix...)))
		}
		if len(prefix) == probeDepth {
			return
		}
		for b := uint32(0); b < probeAlphabet; b++ {
			rec(append(append([]uint32(nil), prefix...), b))
		}
	}
	rec(nil)
	return out
}

// TestRandomizedAgainstModel applies random events of many workers
// concurrently (stores under random held parents, removals of random
// blocks, most of them in the middle of chains, clears, engine hashes
// reused, unknown parents, every tier, worker resets, removals after
// which the worker comes back in whatever slot is free, and room reserved
// for a worker's cache and cancelled) while readers
// match concurrently, in rounds. The workers spread over three 64-slot
// holder chunks. During a round one reader also recounts the holder bits
// against the index's pair count now and then; after each round every
// worker's held blocks and tiers, as the holder bits have them, and every
// probe's Match are compared with the plain model of every worker, the
// size counters are recounted, and the index is rebuilt from its dump.
func TestRandomizedAgainstModel(t *testing.T) {
	const (
		workers = 130 // slots in three 64-slot chunks
		rounds  = 8
		events  = 50 // per worker and round
		readers = 2
	)
	ix := newIndex(t)
	indexer.SetSweepMin(ix, 1) // sweep dead run starts often
	models := make([]*model, workers)
	rngs := make([]*rand.Rand, workers)
	nexts := make([]kvroute.ExternalHash, workers)
	for w := range workers {
		models[w] = newModel()
		rngs[w] = rand.New(rand.NewPCG(uint64(w), 42))
		nexts[w] = kvroute.ExternalHash(w) << 32
	}
	probeSet := probes()
	for round := range rounds {
		var wg sync.WaitGroup
		var stop atomic.Bool
		for r := range readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var res indexer.MatchResult
				for i := 0; !stop.Load(); i++ {
					p := probeSet[(i*7+r)%len(probeSet)]
					ix.Match(p, &res)
					for _, m := range res.Workers {
						sum := 0
						for _, c := range m.ByTier {
							sum += c
						}
						if sum != m.Blocks || m.Blocks < 1 || m.Blocks > len(p) {
							t.Errorf("inconsistent match %+v", m)
							return
						}
					}
					_ = ix.Size()
					if r == 0 && i%256 == 0 {
						// The bits agree with the counts at every write's end.
						if _, _, err := indexer.HeldBlocks(ix); err != nil {
							t.Errorf("round %d: %v", round, err)
							return
						}
					}
				}
			}()
		}
		var writers sync.WaitGroup
		for w := range workers {
			writers.Add(1)
			go func() {
				defer writers.Done()
				key, m := wk(uint64(w)), models[w]
				for i := range uint64(events) {
					id := uint64(round)*events + i + 1
					switch rngs[w].IntN(100) {
					case 0:
						// The engine restarted: the event below is the
						// worker's new baseline.
						ix.ResetWorker(key)
						clear(m.blocks)
					case 1:
						// The worker leaves and comes back with the event
						// below, in whatever slot is free then.
						ix.RemoveWorker(key)
						clear(m.blocks)
					case 2, 3:
						// The host learns the worker's cache capacity and
						// makes room for it, or cancels the room: the
						// worker's map grows now or stops keeping a floor.
						ix.ReserveWorker(key, rngs[w].IntN(3)*40)
					}
					ev := randomEvent(rngs[w], key, id, m, &nexts[w])
					ev.Tier = kvroute.Tier(rngs[w].IntN(int(kvroute.NumTiers)))
					err := ix.Apply(ev)
					unknownParent := ev.HasParent && ev.Parent == 1<<60
					if repeatsBlock(ev) && !unknownParent {
						if !errors.Is(err, indexer.ErrRepeatedBlock) {
							t.Errorf("worker %d event %d repeats a block: %v, want ErrRepeatedBlock", w, id, err)
							return
						}
					} else if err != nil && !unknownParent {
						t.Errorf("worker %d event %d: %v", w, id, err)
						return
					}
					m.apply(ev)
					if i == events/2 && w%10 == 0 {
						// A duplicate is never applied twice.
						if err := ix.Apply(ev); err == nil {
							t.Errorf("duplicate accepted")
						}
					}
				}
			}()
		}
		writers.Wait()
		stop.Store(true)
		wg.Wait()
		if t.Failed() {
			return
		}
		checkAgainstModels(t, ix, models, probeSet)
		checkDumpRoundTrip(t, ix, prompt(0, 1, 2, 0, 1, 2))
	}

	// Removing every worker leaves nothing behind.
	for w := range workers {
		require.True(t, ix.RemoveWorker(wk(uint64(w))))
	}
	require.Equal(t, indexer.Size{Bytes: ix.Size().Bytes}, ix.Size())
	require.LessOrEqual(t, ix.Size().Bytes, int64(1<<20), "an emptied index keeps only its table")
}

// heldMismatch recounts the blocks every worker holds from the index's
// holder bits (indexer.HeldBlocks) and compares them with models, which
// has the model of every worker that was sent events: each worker's blocks
// and their tiers exactly, and the pair count with Size().Pairs and the
// models'. The bits are what Match reads, so a worker that lost blocks
// anywhere in a chain is seen even where no prompt's match would show it.
// It returns nil when they agree.
func heldMismatch(ix *indexer.Index, models map[kvroute.WorkerKey]*model) error {
	held, pairs, err := indexer.HeldBlocks(ix)
	if err != nil {
		return err
	}
	if n := ix.Size().Pairs; n != pairs {
		return fmt.Errorf("holder bits make %d pairs, Size().Pairs %d", pairs, n)
	}
	modelPairs := 0
	for w, m := range models {
		want, got := m.tiersBySeq(), held[w]
		modelPairs += len(want)
		for s, tiers := range want {
			if got[s] != tiers {
				return fmt.Errorf("worker %v holds %#x in tiers %04b, model %04b", w, uint64(s), got[s], tiers)
			}
		}
		for s, tiers := range got {
			if want[s] == 0 {
				return fmt.Errorf("worker %v holds %#x in tiers %04b, which the model does not", w, uint64(s), tiers)
			}
		}
	}
	for w, got := range held {
		if models[w] == nil {
			return fmt.Errorf("worker %v, sent no event, holds %d blocks", w, len(got))
		}
	}
	if modelPairs != pairs {
		return fmt.Errorf("holder bits make %d pairs, models %d", pairs, modelPairs)
	}
	return nil
}

// checkAgainstModels compares the blocks every worker holds (its
// engine-hash map and the holder bits) and every probe's match with the
// models.
func checkAgainstModels(t *testing.T, ix *indexer.Index, models []*model, probeSet [][]kvroute.SeqHash) {
	t.Helper()
	byKey := make(map[kvroute.WorkerKey]*model, len(models))
	for w, m := range models {
		byKey[wk(uint64(w))] = m
	}
	require.NoError(t, heldMismatch(ix, byKey))
	require.NoError(t, indexer.Recount(ix))
	pairs := 0
	for w, m := range models {
		seqs := map[kvroute.SeqHash]bool{}
		for _, e := range m.blocks {
			seqs[e.seq] = true
		}
		pairs += len(seqs)
		got := ix.AppendWorkerBlocks(wk(uint64(w)), nil)
		require.Len(t, got, len(seqs), "worker %d", w)
		for _, s := range got {
			require.True(t, seqs[s], "worker %d holds an unexpected block", w)
		}
	}
	require.Equal(t, pairs, ix.Size().Pairs)

	tiers := make([]map[kvroute.SeqHash]uint8, len(models))
	for w, m := range models {
		tiers[w] = m.tiersBySeq()
	}
	var res indexer.MatchResult
	for _, p := range probeSet {
		ix.Match(p, &res)
		for w := range models {
			byTier, depth := matchTiers(tiers[w], p)
			got, ok := res.Find(wk(uint64(w)))
			if depth == 0 {
				require.False(t, ok)
				continue
			}
			require.True(t, ok)
			require.Equal(t, depth, got.Blocks)
			require.Equal(t, byTier, got.ByTier)
		}
	}
}

// FuzzApply applies events decoded from the input (8 engine hashes, 3
// block contents, every kind, tier and parent, malformed ones included,
// and removals of a worker, which free its slot for its next event) of
// the workers of fuzzSlots, whose slots are on both sides of each 64-slot
// chunk boundary, and checks the index against the plain model: the blocks
// each worker holds by its engine-hash map and by the holder bits (with
// their tiers), the pair count, every match of every prompt over the three
// contents up to depth 4, and a Dump round trip. The checks use no
// reflection, so that an execution costs little more than the events.
func FuzzApply(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte("stored removed cleared and more bytes"))
	f.Add([]byte{0, 0x80, 3, 0, 0x81, 3, 1, 0x80, 2, 0, 1, 1, 1, 0x80, 3, 0, 1, 2})
	// Slot 0 stores three blocks, slot 1 the first two and drops them one
	// at a time (which leaves two neighbouring segments with the same
	// holders); then a worker of the second chunk (slot 64, then 127)
	// stores the first block and, under it and with its engine hash, the
	// second, which it then holds without the first.
	f.Add([]byte{10, 1, 15, 11, 1, 10, 11, 27, 5, 11, 12, 5, 5, 1, 5, 5, 131, 5})
	f.Add([]byte{10, 1, 15, 11, 1, 10, 11, 27, 5, 11, 12, 5, 17, 1, 5, 17, 131, 25})
	// Slots 0 and 64 store three blocks each; slot 0's worker is removed
	// (kind 4) and stores two again; slot 64's worker is removed, slot
	// 0's worker clears and slot 64's stores three again: a reused slot
	// must hold only what its worker stored since.
	f.Add([]byte{10, 1, 15, 5, 1, 15, 10, 4, 0, 10, 1, 6, 5, 4, 0, 10, 3, 0, 5, 1, 7})
	// Slot 0 stores three blocks at the root by their sequence hashes,
	// then three under the second by their content hashes; slot 64
	// stores the first two by their sequence hashes, and evicts the
	// first.
	f.Add([]byte{10, 1, 0x4b, 30, 0x83, 35, 5, 1, 0x46, 5, 37, 5})
	// Prompts over the three block contents up to depth 4.
	var fuzzProbes [][]kvroute.SeqHash
	var rec func(prefix []kvroute.BlockHash)
	rec = func(prefix []kvroute.BlockHash) {
		if len(prefix) > 0 {
			fuzzProbes = append(fuzzProbes, kvroute.ChainSeqHashes(nil, 0, false, prefix))
		}
		if len(prefix) < 4 {
			for b := range kvroute.BlockHash(3) {
				rec(append(slices.Clone(prefix), b))
			}
		}
	}
	rec(nil)
	f.Fuzz(func(t *testing.T, data []byte) { applyAndCheck(t, data, fuzzProbes) })
}

// fuzzSlots are the slots (and ids) of FuzzApply's workers: on both sides
// of each 64-slot chunk boundary, so that holder sets span three chunks.
var fuzzSlots = [...]int{0, 1, 2, 62, 63, 64, 65, 127, 128, 129}

// applyAndCheck is FuzzApply's body: it applies the events data encodes
// and checks the index against the model.
func applyAndCheck(t *testing.T, data []byte, fuzzProbes [][]kvroute.SeqHash) {
	ix, _ := indexer.New(indexer.Config{Hasher: testHasher})
	indexer.SetSweepMin(ix, 1)
	// Workers take slots in the order they are first seen: every worker
	// up to the highest the input names is known first, so that worker id
	// has slot id.
	top := -1
	for i := 0; i+3 <= len(data); i += 3 {
		top = max(top, fuzzSlots[int(data[i])%len(fuzzSlots)])
	}
	for id := range top + 1 {
		if err := ix.Apply(cleared(wk(uint64(id)), 0)); err != nil {
			t.Fatal(err)
		}
	}
	models := map[kvroute.WorkerKey]*model{}
	for i := 0; i+3 <= len(data); i += 3 {
		w := wk(uint64(fuzzSlots[int(data[i])%len(fuzzSlots)]))
		m := models[w]
		if m == nil {
			m = newModel()
			models[w] = m
		}
		if data[i+1]%5 == 4 {
			// The worker is removed: its slot is freed, and its next
			// event registers it again, in a slot whose old bits must
			// not come back.
			ix.RemoveWorker(w)
			models[w] = newModel()
			continue
		}
		ev := &kvroute.Event{Kind: kvroute.EventKind(data[i+1] % 5), Worker: w, Tier: kvroute.Tier(data[i+2] % 5)}
		if data[i+1]&0x80 != 0 {
			ev.HasParent, ev.Parent = true, kvroute.ExternalHash(data[i+2]%8)
		}
		for j := range int(data[i+2] % 4) {
			ev.Blocks = append(ev.Blocks, kvroute.StoredBlock{External: kvroute.ExternalHash((int(data[i]) + j) % 8), Hash: kvroute.BlockHash((j + int(data[i+1]>>5)) % 3)})
			ev.Removed = append(ev.Removed, kvroute.ExternalHash((int(data[i+1])+j)%8))
		}
		switch ev.Kind {
		case kvroute.EventStored:
			ev.Removed = nil
		case kvroute.EventRemoved:
			ev.Blocks, ev.HasParent = nil, false
		}
		applied := ev
		if ev.Kind == kvroute.EventStored && data[i+2]&0x40 != 0 {
			// The same blocks by their sequence hashes, as a dump names
			// them (the model chains the content hashes).
			applied = m.seqHashes(ev)
		}
		if err := ix.Apply(applied); err == nil || errors.Is(err, indexer.ErrRepeatedBlock) {
			m.apply(ev) // the model cuts a repeat short as the index does
		} else if ev.Validate() == nil && ev.Kind != kvroute.EventStored {
			t.Fatalf("valid %v rejected: %v", ev, err)
		}
	}
	pairs := 0
	tiers := map[kvroute.WorkerKey]map[kvroute.SeqHash]uint8{}
	for w, m := range models {
		held := m.tiersBySeq()
		tiers[w] = held
		pairs += len(held)
		got := ix.AppendWorkerBlocks(w, nil)
		if len(got) != len(held) {
			t.Fatalf("worker %v holds %d blocks, model %d", w, len(got), len(held))
		}
		for _, s := range got {
			if held[s] == 0 {
				t.Fatalf("worker %v holds %#x, which the model does not", w, uint64(s))
			}
		}
	}
	if got := ix.Size().Pairs; got != pairs {
		t.Fatalf("%d pairs, model %d", got, pairs)
	}
	if err := heldMismatch(ix, models); err != nil {
		t.Fatal(err)
	}
	var res indexer.MatchResult
	for _, p := range fuzzProbes {
		ix.Match(p, &res)
		for w := range models {
			byTier, depth := matchTiers(tiers[w], p)
			got, ok := res.Find(w)
			if ok != (depth > 0) || got.Blocks != depth || (ok && got.ByTier != byTier) {
				t.Fatalf("worker %v on a %d-block prompt: index %+v (found %v), model %d blocks %v", w, len(p), got, ok, depth, byTier)
			}
		}
	}
	rebuilt, _ := indexer.New(indexer.Config{Hasher: testHasher})
	if err := ix.Dump(rebuilt.Apply); err != nil {
		t.Fatalf("dump: %v", err)
	}
	if a, b := ix.Size(), rebuilt.Size(); a.Pairs != b.Pairs || a.Entries != b.Entries || a.Blocks != b.Blocks {
		t.Fatalf("rebuilt from its dump: %+v, index %+v", b, a)
	}
}

// TestRandomizedSpreadSlots applies random events (docEvent) of a few
// workers, one at a time, after 130 workers took their slots, so that the
// few are in slots on both sides of each 64-slot chunk boundary and share
// their blocks' holder sets with each other only. Every few events and after
// every trial, each worker's held blocks and tiers, as the holder bits
// have them, and the pair count are compared with the models.
func TestRandomizedSpreadSlots(t *testing.T) {
	const (
		trials     = 200
		events     = 400 // per trial
		checkEvery = 10
		allWorkers = 130
	)
	spread := []int{0, 1, 62, 63, 64, 65, 127, 128, 129} // the first four in chunk 0
	probeSet := probes()
	for trial := range trials {
		r := rand.New(rand.NewPCG(uint64(trial), 43))
		ix := newIndex(t)
		indexer.SetSweepMin(ix, 1+r.IntN(4))
		for id := range allWorkers { // worker id takes slot id
			require.NoError(t, ix.Apply(cleared(wk(uint64(id)), 0)))
		}
		// Two or three workers of the first chunk and one of a later
		// one, so that they share holder sets.
		low, high := spread[:4], spread[4:]
		active := []int{low[r.IntN(len(low))], low[r.IntN(len(low))], high[r.IntN(len(high))]}
		if r.IntN(2) == 0 {
			active = append(active, low[r.IntN(len(low))])
		}
		models := map[kvroute.WorkerKey]*model{}
		ids := map[kvroute.WorkerKey]uint64{}
		var next kvroute.ExternalHash
		docWorkers := map[kvroute.WorkerKey]*docWorker{}
		for i := range events {
			w := wk(uint64(active[r.IntN(len(active))]))
			if models[w] == nil {
				models[w] = newModel()
				docWorkers[w] = &docWorker{ext: map[[2]int]kvroute.ExternalHash{}}
			}
			ids[w]++
			ev := docEvent(r, w, ids[w], models[w], docWorkers[w], &next)
			if err := ix.Apply(ev); err != nil && !(ev.HasParent && ev.Parent == 1<<60) {
				t.Fatalf("trial %d event %d: %v", trial, i, err)
			}
			models[w].apply(ev)
			if i%checkEvery == 0 {
				if err := heldMismatch(ix, models); err != nil {
					t.Fatalf("trial %d (workers in slots %v) after event %d: %v", trial, active, i, err)
				}
			}
		}
		if err := heldMismatch(ix, models); err != nil {
			t.Fatalf("trial %d (workers in slots %v) at its end: %v", trial, active, err)
		}
		var res indexer.MatchResult
		for _, p := range probeSet {
			ix.Match(p, &res)
			for w, m := range models {
				byTier, depth := m.match(p)
				got, ok := res.Find(w)
				if ok != (depth > 0) || got.Blocks != depth || (ok && got.ByTier != byTier) {
					t.Fatalf("trial %d: worker %v on a %d-block prompt: index %+v (found %v), model %d blocks %v", trial, w, len(p), got, ok, depth, byTier)
				}
			}
		}
	}
}

// docWorker is what docEvent remembers of a worker: the engine hash it
// last gave each (document, block) it stored.
type docWorker struct {
	ext map[[2]int]kvroute.ExternalHash
}

// docs are the block hashes of three 8-block documents over the probe
// alphabet that every docEvent worker stores parts of, so that workers
// share long stretches of runs.
var docs = func() [][]kvroute.BlockHash {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([][]kvroute.BlockHash, 3)
	for d := range out {
		for range 8 {
			out[d] = append(out[d], testHasher.HashBlock(prompt(uint32(r.IntN(3)))))
		}
	}
	return out
}()

// docEvent makes a plausible event for a worker whose state is m and dw:
// stores of a part of a document, at the root or under the worker's block
// before it, sometimes reusing the engine hash of another block the worker
// holds (which the new block takes over, leaving a hole where the old one
// was); removals of a few held blocks; clears.
func docEvent(r *rand.Rand, w kvroute.WorkerKey, id uint64, m *model, dw *docWorker, nextExt *kvroute.ExternalHash) *kvroute.Event {
	tier := kvroute.Tier(r.IntN(3) * r.IntN(2))
	// Forget the blocks the worker no longer holds.
	for k, h := range dw.ext {
		if _, ok := m.blocks[h]; !ok {
			delete(dw.ext, k)
		}
	}
	switch p := r.IntN(100); {
	case p < 55:
		d := r.IntN(len(docs))
		start := 0
		if r.IntN(2) == 0 {
			start = r.IntN(len(docs[d]))
		}
		ev := &kvroute.Event{Kind: kvroute.EventStored, Worker: w, ID: id, Tier: tier}
		if start > 0 {
			h, ok := dw.ext[[2]int{d, start - 1}]
			if !ok {
				start = 0
			} else {
				ev.HasParent, ev.Parent = true, h
			}
		}
		end := start + 1 + r.IntN(len(docs[d])-start)
		for b := start; b < end; b++ {
			*nextExt++
			ext := *nextExt
			if r.IntN(6) == 0 {
				// The engine reuses the hash of another block it holds
				// (not one of this chain's: that would be a block its own
				// ancestor) for this one, which takes it over.
				for k, h := range dw.ext {
					if k[0] != d || k[1] >= end {
						ext = h
						for k2, h2 := range dw.ext {
							if h2 == h {
								delete(dw.ext, k2)
							}
						}
						break
					}
				}
			}
			ev.Blocks = append(ev.Blocks, kvroute.StoredBlock{External: ext, Hash: docs[d][b]})
			dw.ext[[2]int{d, b}] = ext
		}
		return ev
	case p < 95:
		ev := &kvroute.Event{Kind: kvroute.EventRemoved, Worker: w, ID: id, Tier: tier}
		for h := range m.blocks {
			ev.Removed = append(ev.Removed, h)
			if r.IntN(3) > 0 {
				break
			}
		}
		return ev
	default:
		return &kvroute.Event{Kind: kvroute.EventCleared, Worker: w, ID: id}
	}
}
