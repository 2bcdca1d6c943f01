package bench

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/stretchr/testify/require"
)

func seqs(ids ...uint64) []kvroute.SeqHash {
	out := make([]kvroute.SeqHash, len(ids))
	for i, id := range ids {
		out[i] = kvroute.SeqHash(id)
	}
	return out
}

func TestPrefixCacheEvictsUnreferencedLRU(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		// prompts are run one after another: each pins its blocks,
		// names them and releases them (deepest first).
		prompts     [][]kvroute.SeqHash
		pinned      []kvroute.SeqHash // held by a running request at the end
		reserve     int
		wantOK      bool
		wantEvicted []kvroute.SeqHash
	}{
		{
			name: "oldest request's deepest block first", capacity: 4,
			prompts: [][]kvroute.SeqHash{seqs(1, 2), seqs(3, 4)}, reserve: 1, wantOK: true,
			wantEvicted: seqs(2),
		},
		{
			name: "pinned blocks are never evicted", capacity: 4,
			prompts: [][]kvroute.SeqHash{seqs(1, 2), seqs(3, 4)}, pinned: seqs(1, 2), reserve: 2, wantOK: true,
			wantEvicted: seqs(4, 3),
		},
		{
			name: "not enough evictable blocks", capacity: 4,
			prompts: [][]kvroute.SeqHash{seqs(1, 2), seqs(3, 4)}, pinned: seqs(1, 2, 3), reserve: 2, wantOK: false,
		},
		{
			name: "free blocks first", capacity: 6,
			prompts: [][]kvroute.SeqHash{seqs(1, 2)}, reserve: 4, wantOK: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newPrefixCache(tc.capacity)
			var evicted []kvroute.SeqHash
			record := func(s kvroute.SeqHash) { evicted = append(evicted, s) }
			for _, p := range tc.prompts {
				require.True(t, c.reserve(len(p), record))
				var named []*cacheBlock
				for _, s := range p {
					named = append(named, c.insert(s))
				}
				for i := len(named) - 1; i >= 0; i-- {
					c.unpin(named[i])
				}
			}
			for _, s := range tc.pinned {
				c.pin(c.lookup(s))
			}
			ok := c.reserve(tc.reserve, record)
			require.Equal(t, tc.wantOK, ok)
			require.Equal(t, tc.wantEvicted, evicted)
			for _, s := range tc.pinned {
				require.NotNil(t, c.lookup(s), "pinned block %d evicted", s)
			}
			require.LessOrEqual(t, c.used, c.capacity)
		})
	}
}

func TestPrefixCacheMatchStopsAtFirstMiss(t *testing.T) {
	c := newPrefixCache(8)
	require.True(t, c.reserve(3, func(kvroute.SeqHash) {}))
	for _, s := range seqs(1, 2, 4) {
		c.unpin(c.insert(s))
	}
	tests := []struct {
		seqs  []kvroute.SeqHash
		limit int
		want  int
	}{
		{seqs(1, 2, 3, 4), 10, 2},
		{seqs(1, 2), 1, 1},
		{seqs(5, 1), 10, 0},
		{seqs(1, 2, 4), 10, 3},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, c.match(tc.seqs, tc.limit), "match(%v, %d)", tc.seqs, tc.limit)
	}
}

// stepper runs one engine alone and records its timeline.
type stepper struct {
	e   *engine
	now time.Duration
	// first and done are the times of each request's first and last token.
	first, done map[*simReq]time.Duration
}

func newStepper(cfg EngineConfig, blockSize int) *stepper {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: blockSize})
	return &stepper{e: newEngine(1, cfg.withDefaults(), h), first: map[*simReq]time.Duration{}, done: map[*simReq]time.Duration{}}
}

func (s *stepper) add(w *Request) *simReq {
	r := &simReq{w: w, promptLen: w.Prompt.Len(), outputLen: max(w.Output.Len, 1)}
	s.e.enqueue(r, w.Prompt.AppendTokens(nil))
	return r
}

// runAll steps the engine until it is idle.
func (s *stepper) runAll(t *testing.T) {
	t.Helper()
	for range 1_000_000 {
		d, ok := s.e.startStep()
		_, _ = s.e.flushEvents(nil, s.now)
		if !ok {
			return
		}
		s.now += d
		s.e.finishStep(
			func(r *simReq) { s.first[r] = s.now },
			func(*simReq) {},
			func(r *simReq) { s.done[r] = s.now },
		)
		_, _ = s.e.flushEvents(nil, s.now)
	}
	t.Fatal("engine never went idle")
}

func TestEngineTiming(t *testing.T) {
	cfg := EngineConfig{
		CacheBlocks: 1024, PrefillTokensPerSecond: 10000, MaxBatchedTokens: 1000, MaxBatch: 4,
		StepOverhead: 10 * time.Millisecond, DecodePerSequence: time.Millisecond,
	}
	tests := []struct {
		name               string
		prompt, output     int
		wantFirst, wantEnd time.Duration
	}{
		// One step of 500 prefill tokens (10 ms + 50 ms) gives the first
		// token; each further token is a step of 10 ms + 1 ms.
		{"one prefill step", 500, 3, 60 * time.Millisecond, 82 * time.Millisecond},
		// 2,500 tokens take three chunked steps: 2 × (10+100) + (10+50).
		{"chunked prefill", 2500, 1, 280 * time.Millisecond, 280 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStepper(cfg, 16)
			r := s.add(&Request{Prompt: Prompt{{Seed: 1, Len: tc.prompt}}, Output: Segment{Seed: 2, Len: tc.output}})
			s.runAll(t)
			require.Equal(t, tc.wantFirst, s.first[r])
			require.Equal(t, tc.wantEnd, s.done[r])
		})
	}
}

func TestEngineDecodeSlowsWithBatch(t *testing.T) {
	cfg := EngineConfig{
		CacheBlocks: 4096, PrefillTokensPerSecond: 1e9, MaxBatchedTokens: 1 << 20, MaxBatch: 64,
		StepOverhead: 10 * time.Millisecond, DecodePerSequence: time.Millisecond,
	}
	decodeTime := func(batch int) time.Duration {
		s := newStepper(cfg, 16)
		var rs []*simReq
		for i := range batch {
			rs = append(rs, s.add(&Request{Prompt: Prompt{{Seed: uint64(i), Len: 64}}, Output: Segment{Seed: 99, Len: 11}}))
		}
		s.runAll(t)
		return s.done[rs[0]] - s.first[rs[0]]
	}
	// Ten decode steps of 10 ms + batch × 1 ms.
	require.Equal(t, 110*time.Millisecond, decodeTime(1))
	require.Equal(t, 180*time.Millisecond, decodeTime(8))
}

func TestEngineReusesCachedPrefix(t *testing.T) {
	s := newStepper(EngineConfig{CacheBlocks: 256}, 16)
	system := Segment{Seed: 7, Len: 200} // 12 full blocks and 8 tokens
	a := s.add(&Request{Prompt: Prompt{system, {Seed: 1, Len: 50}}, Output: Segment{Seed: 3, Len: 4}})
	s.runAll(t)
	b := s.add(&Request{Prompt: Prompt{system, {Seed: 2, Len: 50}}, Output: Segment{Seed: 4, Len: 4}})
	s.runAll(t)
	require.Equal(t, 0, a.cachedTokens)
	require.Equal(t, 12*16, b.cachedTokens)
	require.Equal(t, 0, s.e.cache.pinned(), "blocks pinned after every request finished")
	require.Positive(t, s.e.stored)
}

func TestEngineWaitsForBlocks(t *testing.T) {
	// Each request needs 8 blocks; the cache has 12: the second waits for
	// the first to finish.
	s := newStepper(EngineConfig{CacheBlocks: 12, MaxBatch: 8}, 16)
	a := s.add(&Request{Prompt: Prompt{{Seed: 1, Len: 100}}, Output: Segment{Seed: 3, Len: 28}})
	b := s.add(&Request{Prompt: Prompt{{Seed: 2, Len: 100}}, Output: Segment{Seed: 4, Len: 28}})
	s.runAll(t)
	require.GreaterOrEqual(t, s.first[b], s.done[a])
	require.LessOrEqual(t, s.e.cache.used, 12)
}

func TestDynamoMockerStepTime(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	const capacity = 800 * 16
	tests := []struct {
		name                       string
		prefill, decoding, context int
		capacity                   int
		want                       time.Duration
	}{
		{"nothing to do", 0, 0, 0, capacity, 0},
		// 16.50142 + 1.518344e-2·128 + 4.209989e-7·128².
		{"a cached prompt's 128 new tokens", 128, 0, 0, capacity, ms(18.451798)},
		// 16.50142 + 1.518344e-2·1632 + 4.209989e-7·1632².
		{"a 1,632-token prompt", 1632, 0, 0, capacity, ms(42.402093)},
		// u = 1,700 / 12,800: 5.74 + 54.01·u − 25.74·u².
		{"one request decoding", 0, 1, 1700, capacity, ms(12.459171)},
		{"a prefill beside it", 128, 1, 1700, capacity, ms(18.451798 + 12.459171)},
		// u is at most 1: 5.74 + 54.01 − 25.74.
		{"more context than the cache", 0, 9, 3 * capacity, capacity, ms(34.01)},
		{"no capacity counts as full", 0, 1, 16, 0, ms(34.01)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := mockerStep(tc.prefill, tc.decoding, tc.context, tc.capacity)
			require.InDelta(t, float64(tc.want), float64(got), float64(time.Microsecond))
		})
	}
}

func TestEngineDynamoMockerTiming(t *testing.T) {
	cfg := EngineConfig{CacheBlocks: 800, MaxBatch: 256, Timing: TimingDynamoMocker}
	system := Segment{Seed: 7, Len: 1504} // 94 full blocks
	s := newStepper(cfg, 16)
	a := s.add(&Request{Prompt: Prompt{system, {Seed: 1, Len: 128}}, Output: Segment{Seed: 3, Len: 3}})
	s.runAll(t)
	// The first request prefills 1,632 tokens and takes its first token
	// from that step; each further token is a decode step of its context.
	prefill := mockerStep(1632, 0, 0, 800*16)
	require.Equal(t, prefill, s.first[a])
	require.Equal(t, prefill+mockerStep(0, 1, 1633, 800*16)+mockerStep(0, 1, 1634, 800*16), s.done[a])

	// On the idle engine a request with the same system prompt prefills
	// only its own 128 tokens.
	start := s.now
	b := s.add(&Request{Prompt: Prompt{system, {Seed: 2, Len: 128}}, Output: Segment{Seed: 4, Len: 1}})
	s.runAll(t)
	require.Equal(t, 1504, b.cachedTokens)
	require.Equal(t, mockerStep(128, 0, 0, 800*16), s.first[b]-start)
}

func TestEngineConfigRejectsUnknownTiming(t *testing.T) {
	err := EngineConfig{Timing: TimingDynamoMocker + 1}.withDefaults().validate()
	require.ErrorIs(t, err, ErrInvalidConfig)
}
