package scheduling_test

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

func newTracker(t testing.TB, clock kvroute.Clock) *scheduling.Tracker {
	t.Helper()
	tr, err := scheduling.NewTracker(scheduling.TrackerConfig{BlockSize: 16, TTL: time.Minute, Clock: clock})
	require.NoError(t, err)
	return tr
}

// chain returns n sequence hashes of a prompt family: prompts with the same
// family share their leading blocks, like prompts behind one system prompt.
func chain(family uint64, n int) []kvroute.SeqHash {
	out := make([]kvroute.SeqHash, n)
	for i := range out {
		out[i] = kvroute.SeqHash(family<<32 | uint64(i))
	}
	return out
}

// branch returns a chain that shares its first shared blocks with
// chain(family, ·) and then continues privately under tag. Like real
// sequence hashes, a block's hash names its whole prefix: the branch point
// is part of it.
func branch(family uint64, shared, n int, tag uint64) []kvroute.SeqHash {
	out := chain(family, n)
	for i := shared; i < n; i++ {
		out[i] = kvroute.SeqHash(tag<<56 | uint64(shared)<<40 | family<<32 | uint64(i))
	}
	return out
}

func TestTrackerLifecycle(t *testing.T) {
	tr := newTracker(t, newManualClock())
	w1, w2 := worker(1), worker(2)
	load := func(w kvroute.WorkerKey) scheduling.WorkerLoad { return tr.Load(w) }

	require.NoError(t, tr.Add(1, w1, chain(7, 10), 160))
	require.Equal(t, scheduling.WorkerLoad{ActiveRequests: 1, ActivePrefillTokens: 160, ActiveBlocks: 10}, load(w1))

	// A second request sharing 6 blocks adds only its 4 new blocks.
	require.NoError(t, tr.Add(2, w1, branch(7, 6, 10, 1), 64))
	require.Equal(t, scheduling.WorkerLoad{ActiveRequests: 2, ActivePrefillTokens: 224, ActiveBlocks: 14}, load(w1))

	// The same prompt on another worker is counted there on its own.
	require.NoError(t, tr.Add(3, w2, chain(7, 10), 160))
	require.Equal(t, scheduling.WorkerLoad{ActiveRequests: 1, ActivePrefillTokens: 160, ActiveBlocks: 10}, load(w2))

	require.ErrorIs(t, tr.Add(1, w2, chain(8, 1), 16), scheduling.ErrDuplicateRequest)
	require.ErrorIs(t, tr.Add(9, w2, chain(8, 1), -1), scheduling.ErrInvalidRequest)
	require.Equal(t, 3, tr.Len())

	// First token: prefill tokens are released, blocks stay; only once.
	require.True(t, tr.PrefillDone(1))
	require.False(t, tr.PrefillDone(1))
	require.Equal(t, scheduling.WorkerLoad{ActiveRequests: 2, ActivePrefillTokens: 64, ActiveBlocks: 14}, load(w1))

	// Output tokens open blocks of 16: 1 token → 1 block, 16 → 1, 17 → 2, 40 → 3.
	for _, step := range []struct{ add, blocks int }{{1, 15}, {15, 15}, {1, 16}, {23, 17}} {
		require.True(t, tr.AddOutputTokens(1, step.add))
		require.Equal(t, step.blocks, load(w1).ActiveBlocks)
	}
	require.False(t, tr.AddOutputTokens(1, -1))

	// Free releases the output blocks and the unshared prompt blocks only.
	require.True(t, tr.Free(1))
	require.Equal(t, scheduling.WorkerLoad{ActiveRequests: 1, ActivePrefillTokens: 64, ActiveBlocks: 10}, load(w1))
	// Freeing a request whose prefill never completed releases its tokens.
	require.True(t, tr.Free(2))
	require.Equal(t, scheduling.WorkerLoad{}, load(w1))

	// Everything on a freed or unknown id is harmless.
	for _, id := range []scheduling.RequestID{1, 2, 12345} {
		require.False(t, tr.Free(id))
		require.False(t, tr.PrefillDone(id))
		require.False(t, tr.AddOutputTokens(id, 5))
	}
	require.Equal(t, scheduling.WorkerLoad{}, tr.Load(worker(99)))
	require.Equal(t, 1, tr.Len())
}

func TestTrackerDoesNotRetainBlocks(t *testing.T) {
	tr := newTracker(t, newManualClock())
	blocks := chain(3, 4)
	require.NoError(t, tr.Add(1, worker(1), blocks, 0))
	for i := range blocks {
		blocks[i] = 0
	}
	require.Equal(t, 0, tr.PotentialDecodeBlocks(worker(1), chain(3, 4))-4)
	require.True(t, tr.Free(1))
	require.Equal(t, scheduling.WorkerLoad{}, tr.Load(worker(1)))
}

func TestTrackerPotentialDecodeBlocks(t *testing.T) {
	tr := newTracker(t, newManualClock())
	w := worker(1)
	require.NoError(t, tr.Add(1, w, chain(1, 8), 0))
	require.NoError(t, tr.Add(2, w, branch(1, 3, 12, 1), 0)) // 9 new blocks
	require.True(t, tr.AddOutputTokens(2, 20))               // 2 output blocks
	active := 8 + 9 + 2
	tests := []struct {
		name   string
		blocks []kvroute.SeqHash
		want   int
	}{
		{"empty prompt", nil, active},
		{"unrelated prompt", chain(2, 5), active + 5},
		{"fully active prompt", chain(1, 8), active},
		{"active prefix of 3 then new", branch(1, 3, 10, 2), active + 7},
		{"longer than any active chain", chain(1, 20), active + 12},
		{"active prefix of 12 along the branch", branch(1, 3, 13, 1), active + 1},
		{"one block", chain(1, 1), active},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tr.PotentialDecodeBlocks(w, tt.blocks))
			c := scheduling.Candidate{Worker: w, Load: scheduling.Load{KVUtilization: 0.5}}
			tr.FillLoad(&c, tt.blocks)
			require.Equal(t, scheduling.Load{
				ActiveRequests: 2, ActiveDecodeBlocks: active, PotentialDecodeBlocks: tt.want, KVUtilization: 0.5,
			}, c.Load)
		})
	}
	require.Equal(t, 6, tr.PotentialDecodeBlocks(worker(2), chain(1, 6)))
	c := scheduling.Candidate{Worker: worker(2), Load: scheduling.Load{ActiveRequests: 9}}
	tr.FillLoad(&c, chain(1, 6))
	require.Equal(t, scheduling.Load{PotentialDecodeBlocks: 6}, c.Load)
}

// model is the dumb version of Tracker: a list of requests, recounted on
// every question.
type model struct {
	reqs map[scheduling.RequestID]*modelReq
}

type modelReq struct {
	w       kvroute.WorkerKey
	blocks  []kvroute.SeqHash
	prefill int
	done    bool
	output  int
}

func (m *model) load(w kvroute.WorkerKey, blockSize int) scheduling.WorkerLoad {
	var l scheduling.WorkerLoad
	seen := map[kvroute.SeqHash]bool{}
	for _, r := range m.reqs {
		if r.w != w {
			continue
		}
		l.ActiveRequests++
		if !r.done {
			l.ActivePrefillTokens += r.prefill
		}
		for _, b := range r.blocks {
			seen[b] = true
		}
		l.ActiveBlocks += (r.output + blockSize - 1) / blockSize
	}
	l.ActiveBlocks += len(seen)
	return l
}

func (m *model) potential(w kvroute.WorkerKey, blocks []kvroute.SeqHash, blockSize int) int {
	active := map[kvroute.SeqHash]bool{}
	for _, r := range m.reqs {
		if r.w == w {
			for _, b := range r.blocks {
				active[b] = true
			}
		}
	}
	n := m.load(w, blockSize).ActiveBlocks
	for _, b := range blocks {
		if !active[b] {
			n++
		}
	}
	return n
}

func TestTrackerMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tr := newTracker(t, newManualClock())
	m := &model{reqs: map[scheduling.RequestID]*modelReq{}}
	workers := []kvroute.WorkerKey{worker(1), worker(2), worker(3)}
	randomPrompt := func() []kvroute.SeqHash {
		n := rng.IntN(24)
		return branch(uint64(rng.IntN(3)), rng.IntN(n+1), n, uint64(rng.IntN(4)+1))
	}
	next := scheduling.RequestID(1)
	for step := range 1500 {
		id := scheduling.RequestID(rng.IntN(int(next)) + 1)
		switch op := rng.IntN(10); {
		case op < 4:
			w := workers[rng.IntN(len(workers))]
			blocks, prefill := randomPrompt(), rng.IntN(2000)
			require.NoError(t, tr.Add(next, w, blocks, prefill))
			m.reqs[next] = &modelReq{w: w, blocks: blocks, prefill: prefill}
			next++
		case op < 6:
			r := m.reqs[id]
			require.Equal(t, r != nil && !r.done, tr.PrefillDone(id), "step %d", step)
			if r != nil {
				r.done = true
			}
		case op < 8:
			n := rng.IntN(40)
			r := m.reqs[id]
			require.Equal(t, r != nil, tr.AddOutputTokens(id, n), "step %d", step)
			if r != nil {
				r.output += n
			}
		default:
			require.Equal(t, m.reqs[id] != nil, tr.Free(id), "step %d", step)
			delete(m.reqs, id)
		}
		for _, w := range workers {
			require.Equal(t, m.load(w, 16), tr.Load(w), "step %d worker %v", step, w)
		}
		q := randomPrompt()
		w := workers[rng.IntN(len(workers))]
		want := m.potential(w, q, 16)
		require.Equal(t, want, tr.PotentialDecodeBlocks(w, q), "step %d", step)
		// FillLoad starts from the cached depth as a guess; any guess is exact.
		c := scheduling.Candidate{Worker: w, Cached: [kvroute.NumTiers]int{rng.IntN(len(q) + 2), rng.IntN(2)}}
		tr.FillLoad(&c, q)
		require.Equal(t, want, c.Load.PotentialDecodeBlocks, "step %d guess %v", step, c.Cached)
	}
	require.Equal(t, len(m.reqs), tr.Len())
}

func TestTrackerExpire(t *testing.T) {
	clock := newManualClock()
	tr := newTracker(t, clock) // TTL one minute
	w := worker(1)
	require.NoError(t, tr.Add(1, w, chain(1, 4), 64))
	require.NoError(t, tr.Add(2, w, chain(2, 4), 64))
	clock.Advance(40 * time.Second)
	require.NoError(t, tr.Add(3, w, chain(3, 4), 64))
	require.True(t, tr.AddOutputTokens(2, 1)) // keeps request 2 alive
	require.Zero(t, tr.Expire())

	clock.Advance(30 * time.Second) // request 1 is 70 s idle
	require.Equal(t, 1, tr.Expire())
	require.Equal(t, scheduling.WorkerLoad{ActiveRequests: 2, ActivePrefillTokens: 128, ActiveBlocks: 9}, tr.Load(w))
	require.False(t, tr.Free(1))

	clock.Advance(time.Hour)
	require.Equal(t, 2, tr.Expire())
	require.Equal(t, scheduling.WorkerLoad{}, tr.Load(w))
	require.Zero(t, tr.Len())
}

func TestTrackerRemoveWorker(t *testing.T) {
	tr := newTracker(t, newManualClock())
	require.NoError(t, tr.Add(1, worker(1), chain(1, 4), 64))
	require.NoError(t, tr.Add(2, worker(1), chain(2, 4), 64))
	require.NoError(t, tr.Add(3, worker(2), chain(1, 4), 64))
	require.Equal(t, 2, tr.RemoveWorker(worker(1)))
	require.Zero(t, tr.RemoveWorker(worker(1)))
	require.Equal(t, scheduling.WorkerLoad{}, tr.Load(worker(1)))
	require.False(t, tr.PrefillDone(1))
	require.False(t, tr.Free(2))
	require.Equal(t, scheduling.WorkerLoad{ActiveRequests: 1, ActivePrefillTokens: 64, ActiveBlocks: 4}, tr.Load(worker(2)))

	// The worker may come back, with a clean slate.
	require.NoError(t, tr.Add(1, worker(1), chain(1, 2), 32))
	require.Equal(t, scheduling.WorkerLoad{ActiveRequests: 1, ActivePrefillTokens: 32, ActiveBlocks: 2}, tr.Load(worker(1)))
}

func TestTrackerConfigValidation(t *testing.T) {
	for _, cfg := range []scheduling.TrackerConfig{{BlockSize: -1}, {TTL: -time.Second}, {BlockSize: kvroute.MaxBlockSize + 1}} {
		_, err := scheduling.NewTracker(cfg)
		require.ErrorIs(t, err, scheduling.ErrInvalidConfig)
	}
}

func TestTrackerConcurrent(t *testing.T) {
	clock := newManualClock()
	tr := newTracker(t, clock)
	workers := []kvroute.WorkerKey{worker(1), worker(2), worker(3), worker(4)}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for i := range 2000 {
				id := scheduling.RequestID(g*1_000_000 + i)
				w := workers[i%len(workers)]
				blocks := branch(uint64(i%5), 4, 12, uint64(g+1))
				if err := tr.Add(id, w, blocks, 100); err != nil {
					t.Error(err)
					return
				}
				var c scheduling.Candidate
				c.Worker = w
				tr.FillLoad(&c, blocks)
				tr.PrefillDone(id)
				tr.AddOutputTokens(id, 20)
				if i%7 != 0 {
					tr.Free(id)
				}
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			tr.Expire()
			tr.RemoveWorker(worker(4))
		}
	})
	wg.Wait()
	clock.Advance(time.Hour)
	tr.Expire()
	for _, w := range workers {
		require.Equal(t, scheduling.WorkerLoad{}, tr.Load(w), "worker %v", w)
	}
}
