package bench

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/router"
)

// EngineConfig describes one simulated inference engine: a vLLM-like
// continuous-batching server with a prefix cache.
//
// The time model is per scheduler step. A step runs every admitted request:
// requests still in prefill get chunks of their uncached prompt tokens from a
// shared budget of MaxBatchedTokens (chunked prefill, first come first
// served), the others decode one token each. A step takes
//
//	StepOverhead + DecodePerSequence · decoding + prefill tokens / PrefillTokensPerSecond
//
// so decoding slows down as the batch grows and prefill competes with it.
// A request's first token comes at the end of the step that finishes its
// prefill. Timing selects another model of the step's duration:
// TimingDynamoMocker, that of NVIDIA Dynamo's mocker engines.
type EngineConfig struct {
	// CacheBlocks is the KV-cache size in blocks. Running requests pin
	// their prompt and output blocks; unreferenced prefix blocks stay cached
	// and are evicted least recently used first. Zero means 4,096.
	CacheBlocks int
	// PrefillTokensPerSecond is the prefill throughput. Zero means 20,000.
	PrefillTokensPerSecond float64
	// MaxBatchedTokens is the prefill token budget of one step. Zero means
	// 8,192.
	MaxBatchedTokens int
	// MaxBatch is the most requests running at once; more wait in the
	// engine's queue (first come, first served). Zero means 64.
	MaxBatch int
	// StepOverhead is the fixed time of a step. Zero means 8 ms.
	StepOverhead time.Duration
	// DecodePerSequence is the time each decoding request adds to a step.
	// Zero means 250 µs.
	DecodePerSequence time.Duration
	// Timing is the model of a step's duration. The zero value,
	// TimingLinear, is the formula above, from StepOverhead,
	// DecodePerSequence and PrefillTokensPerSecond; TimingDynamoMocker
	// ignores those three.
	Timing Timing
}

// Timing is a model of an engine step's duration.
type Timing uint8

const (
	// TimingLinear is EngineConfig's own model: a fixed overhead, a cost
	// per decoding request and a prefill throughput.
	TimingLinear Timing = iota
	// TimingDynamoMocker is the default timing of NVIDIA Dynamo's mocker
	// engines (the vLLM mocker of ai-dynamo 1.6.1, whose passes follow the
	// polynomial model of its simulation core). A step that prefills x
	// prompt tokens, of every request in it, takes
	//
	//	4.209989e-7·x² + 1.518344e-2·x + 16.50142 ms
	//
	// and then, when requests decode in it, the decode time
	//
	//	max(1, −25.74·u² + 54.01·u + 5.74) ms
	//
	// with u the decoding requests' tokens (prompt and output so far,
	// shared prefixes counted once per request) over the cache's tokens
	// (CacheBlocks times the block size), at most 1. A request whose
	// prefill ends in a step takes its first token from that prefill and
	// does not decode in it. So a request that finds its engine idle waits
	// for its prefill alone, and one that finds requests decoding there
	// waits for the step under way, then for its prefill and their decode.
	TimingDynamoMocker
)

func (c EngineConfig) withDefaults() EngineConfig {
	setDefault(&c.CacheBlocks, 4096)
	setDefault(&c.PrefillTokensPerSecond, 20000)
	setDefault(&c.MaxBatchedTokens, 8192)
	setDefault(&c.MaxBatch, 64)
	setDefault(&c.StepOverhead, 8*time.Millisecond)
	setDefault(&c.DecodePerSequence, 250*time.Microsecond)
	return c
}

func (c EngineConfig) validate() error {
	if c.Timing > TimingDynamoMocker {
		return fmt.Errorf("%w: engine timing %d", ErrInvalidConfig, c.Timing)
	}
	if c.CacheBlocks < 0 || c.MaxBatchedTokens < 0 || c.MaxBatch < 0 || c.StepOverhead < 0 || c.DecodePerSequence < 0 ||
		!(c.PrefillTokensPerSecond >= 0) {
		return fmt.Errorf("%w: negative engine parameter", ErrInvalidConfig)
	}
	return nil
}

// simReq is one request's state inside the simulation.
type simReq struct {
	w      *Request
	dec    router.Decision
	engine *engine

	promptLen, outputLen int
	seqs                 []kvroute.SeqHash // engine-side chained hashes of the full prompt blocks
	named                []*cacheBlock     // pinned named blocks, prompt first
	private              int               // reserved blocks not named
	cachedTokens         int               // prompt tokens found in the cache
	prefillLeft          int               // prompt tokens still to compute
	chunk                int               // prefill tokens computed in the current step
	generated            int               // output tokens so far
	oversized            bool              // longer than the whole cache

	arrival, routed, firstToken time.Duration
}

// engine is one simulated engine. It is driven by the simulator's event
// loop and is not safe for concurrent use.
type engine struct {
	cfg    EngineConfig
	id     kvroute.WorkerID
	hasher kvroute.Hasher
	cache  *prefixCache

	waiting []*simReq // FIFO
	running []*simReq // in admission order
	busy    bool      // a step is in flight

	// Pending KV events of the current step, in order, with their slices
	// reused between flushes.
	events  []kvevents.EngineEvent
	nEvents int
	tokens  []uint32 // scratch for materialised prompts

	stored, removed uint64 // blocks published
}

func newEngine(id kvroute.WorkerID, cfg EngineConfig, h kvroute.Hasher) *engine {
	return &engine{cfg: cfg, id: id, hasher: h, cache: newPrefixCache(cfg.CacheBlocks)}
}

// externalHash is the engine's opaque hash of a block: a scramble of the
// sequence hash, so that the index must navigate by hashes it computes
// itself, as with real engines.
func externalHash(seq kvroute.SeqHash) uint64 { return mix64(uint64(seq) ^ 0x76_6c_6c_6d) }

// enqueue accepts a routed request into the waiting queue.
func (e *engine) enqueue(r *simReq, tokens []uint32) {
	r.engine = e
	r.seqs = e.hasher.AppendSeqHashes(r.seqs[:0], tokens)
	e.waiting = append(e.waiting, r)
}

// active returns the requests in the engine, running or waiting.
func (e *engine) active() int { return len(e.waiting) + len(e.running) }

// blocksFor returns the blocks n tokens occupy.
func (e *engine) blocksFor(n int) int { return (n + e.hasher.BlockSize() - 1) / e.hasher.BlockSize() }

// admit moves waiting requests into the batch while there are free slots
// and blocks, first come first served: a request that does not fit blocks
// the ones behind it, as in vLLM.
func (e *engine) admit() {
	bs := e.hasher.BlockSize()
	for len(e.waiting) > 0 && len(e.running) < e.cfg.MaxBatch {
		r := e.waiting[0]
		full := len(r.seqs)
		// An engine recomputes at least the last prompt token.
		hit := e.cache.match(r.seqs, (r.promptLen-1)/bs)
		total := e.blocksFor(r.promptLen + r.outputLen)
		need := total - hit
		if need > e.cache.available(r.seqs, hit) {
			if total <= e.cache.capacity || len(e.running) > 0 {
				return
			}
			// Longer than the whole cache: run it alone, uncached.
			r.oversized = true
		}
		e.waiting = e.waiting[1:]
		for _, s := range r.seqs[:hit] {
			b := e.cache.lookup(s)
			e.cache.pin(b)
			r.named = append(r.named, b)
		}
		if r.oversized {
			e.cache.forceReserve(need, e.evict)
			r.private = need
		} else {
			e.cache.reserve(need, e.evict)
			r.private = need
			if hit < full {
				e.tokens = r.w.Prompt.AppendTokens(e.tokens[:0])
				e.nameBlocks(r, e.tokens, hit, full)
			}
		}
		r.cachedTokens = hit * bs
		r.prefillLeft = r.promptLen - r.cachedTokens
		e.running = append(e.running, r)
	}
}

// nameBlocks turns reserved private blocks of r into named cache blocks for
// the full blocks [from, to) of tokens, whose chained hashes are r.seqs,
// publishing BlockStored events for the blocks that were not cached yet.
func (e *engine) nameBlocks(r *simReq, tokens []uint32, from, to int) {
	seqs := r.seqs
	bs := e.hasher.BlockSize()
	run := -1 // first block of the current run of new blocks
	flush := func(end int) {
		if run < 0 {
			return
		}
		ev := e.nextEvent(kvevents.BlockStored)
		if run > 0 {
			ev.ParentBlockHash = kvevents.UintHash(externalHash(seqs[run-1]))
		}
		for i := run; i < end; i++ {
			ev.BlockHashes = append(ev.BlockHashes, kvevents.UintHash(externalHash(seqs[i])))
		}
		ev.TokenIDs = append(ev.TokenIDs, tokens[run*bs:end*bs]...)
		ev.BlockSize = bs
		e.stored += uint64(end - run)
		run = -1
	}
	for i := from; i < to; i++ {
		if b := e.cache.lookup(seqs[i]); b != nil {
			// Cached already (another request computed it, or it
			// outlived an evicted parent): share it.
			flush(i)
			e.cache.pin(b)
			r.named = append(r.named, b)
			e.cache.release(1)
			r.private--
			continue
		}
		r.named = append(r.named, e.cache.insert(seqs[i]))
		r.private--
		if run < 0 {
			run = i
		}
	}
	flush(to)
}

// evict publishes the removal of one evicted block.
func (e *engine) evict(seq kvroute.SeqHash) {
	var ev *kvevents.EngineEvent
	if e.nEvents > 0 && e.events[e.nEvents-1].Type == kvevents.BlockRemoved {
		ev = &e.events[e.nEvents-1]
	} else {
		ev = e.nextEvent(kvevents.BlockRemoved)
	}
	ev.BlockHashes = append(ev.BlockHashes, kvevents.UintHash(externalHash(seq)))
	e.removed++
}

// nextEvent appends a pending event of type t, reusing an earlier one's
// slices.
func (e *engine) nextEvent(t kvevents.EventType) *kvevents.EngineEvent {
	if e.nEvents == len(e.events) {
		e.events = append(e.events, kvevents.EngineEvent{})
	}
	ev := &e.events[e.nEvents]
	e.nEvents++
	*ev = kvevents.EngineEvent{
		Type:        t,
		BlockHashes: ev.BlockHashes[:0],
		TokenIDs:    ev.TokenIDs[:0],
		Medium:      kvevents.MediumGPU,
	}
	return ev
}

// flushEvents encodes the pending events as one vLLM batch appended to dst
// and returns it; it returns dst unchanged when there are none.
func (e *engine) flushEvents(dst []byte, now time.Duration) ([]byte, error) {
	if e.nEvents == 0 {
		return dst, nil
	}
	b := kvevents.Batch{
		Timestamp: now.Seconds(),
		Events:    e.events[:e.nEvents],
		RankSlot:  true,
	}
	e.nEvents = 0
	out, err := kvevents.AppendBatch(dst, &b)
	if err != nil {
		return dst, fmt.Errorf("bench: engine %d: encode events: %w", e.id, err)
	}
	return out, nil
}

// startStep admits waiting requests and plans the next step. It returns
// the step's duration, or false when there is nothing to run.
func (e *engine) startStep() (time.Duration, bool) {
	e.admit()
	if len(e.running) == 0 {
		return 0, false
	}
	budget := e.cfg.MaxBatchedTokens
	prefill, decoding, contextTokens := 0, 0, 0
	for _, r := range e.running {
		r.chunk = 0
		if r.prefillLeft > 0 {
			if budget > 0 {
				r.chunk = min(r.prefillLeft, budget)
				budget -= r.chunk
				prefill += r.chunk
			}
			continue
		}
		decoding++
		contextTokens += r.promptLen + r.generated
	}
	if e.cfg.Timing == TimingDynamoMocker {
		return mockerStep(prefill, decoding, contextTokens, e.cfg.CacheBlocks*e.hasher.BlockSize()), true
	}
	d := e.cfg.StepOverhead + time.Duration(decoding)*e.cfg.DecodePerSequence +
		time.Duration(float64(prefill)/e.cfg.PrefillTokensPerSecond*float64(time.Second))
	return d, true
}

// mockerStep returns the duration of a step under TimingDynamoMocker: one
// that prefills prefill tokens and decodes decoding requests holding
// contextTokens tokens, on an engine whose cache holds capacity tokens.
func mockerStep(prefill, decoding, contextTokens, capacity int) time.Duration {
	ms := 0.0
	if prefill > 0 {
		x := float64(prefill)
		ms += 4.209989e-07*x*x + 1.518344e-02*x + 1.650142e+01
	}
	if decoding > 0 {
		u := 1.0
		if capacity > 0 {
			u = min(float64(contextTokens)/float64(capacity), 1)
		}
		ms += max(-25.74*u*u+54.01*u+5.74, 1)
	}
	return time.Duration(ms * float64(time.Millisecond))
}

// finishStep applies the step planned by startStep: it calls first for
// every request whose first token came in this step, token for every
// decoded token batch (request, count) and done for every request that
// finished, after releasing its blocks.
func (e *engine) finishStep(first, token, done func(*simReq)) {
	kept := e.running[:0]
	for _, r := range e.running {
		switch {
		case r.chunk > 0:
			r.prefillLeft -= r.chunk
			r.chunk = 0
			if r.prefillLeft > 0 {
				kept = append(kept, r)
				continue
			}
			r.generated = 1
			first(r)
		case r.prefillLeft == 0:
			r.generated++
			token(r)
		default:
			kept = append(kept, r) // waiting for prefill budget
			continue
		}
		if r.generated >= r.outputLen {
			e.finish(r)
			done(r)
			continue
		}
		kept = append(kept, r)
	}
	clear(e.running[len(kept):])
	e.running = kept
}

// finish caches the full blocks of r's output and releases its blocks.
func (e *engine) finish(r *simReq) {
	bs := e.hasher.BlockSize()
	if !r.oversized {
		full := len(r.seqs)
		total := (r.promptLen + r.outputLen) / bs
		if total > full {
			e.tokens = r.w.Prompt.AppendTokens(e.tokens[:0])
			e.tokens = r.w.Output.AppendTokens(e.tokens)
			r.seqs = e.hasher.AppendSeqHashes(r.seqs[:0], e.tokens[:total*bs])
			e.nameBlocks(r, e.tokens, full, total)
		}
	}
	// Deepest blocks first, so that they are evicted before their parents.
	for i := len(r.named) - 1; i >= 0; i-- {
		e.cache.unpin(r.named[i])
	}
	clear(r.named)
	r.named = r.named[:0]
	e.cache.release(r.private)
	r.private = 0
}
