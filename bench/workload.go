package bench

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute"
)

// Request is one request of a workload.
type Request struct {
	// Arrival is when the request reaches the router, from the start of
	// the run.
	Arrival time.Duration
	// Prompt is the prompt.
	Prompt Prompt
	// Output is what the engine generates: its length is the number of
	// output tokens, its tokens are the ids a later turn of the same
	// conversation sends back as part of its prompt.
	Output Segment
	// Session names the conversation or agent the request belongs to, empty
	// when it belongs to none. Policies with session affinity pass it to the
	// router as the session key.
	Session string
}

// Workload is a reproducible list of requests, sorted by arrival.
type Workload struct {
	// Name is a short name ("shared-prefix", "chat", ...).
	Name string
	// Requests are the requests in arrival order.
	Requests []Request
}

// WorkloadStats summarises a workload.
type WorkloadStats struct {
	Requests     int
	Duration     time.Duration // arrival of the last request
	PromptTokens int64
	OutputTokens int64
	// IdealHitRate is the token hit rate of one infinitely large cache
	// shared by every request, with the given block size: the share of
	// prompt tokens in full blocks that an earlier request's prompt or
	// output already produced. No policy on a finite cluster beats it.
	IdealHitRate float64
}

// Stats computes the workload's statistics for engines with the given
// block size.
func (w *Workload) Stats(blockSize int) (WorkloadStats, error) {
	h, err := kvroute.NewHasher(kvroute.HasherConfig{BlockSize: blockSize})
	if err != nil {
		return WorkloadStats{}, fmt.Errorf("bench: workload stats: %w", err)
	}
	st := WorkloadStats{Requests: len(w.Requests)}
	seen := make(map[kvroute.SeqHash]struct{})
	var tokens []uint32
	var seqs []kvroute.SeqHash
	var hit int64
	bs := h.BlockSize()
	for i := range w.Requests {
		r := &w.Requests[i]
		st.Duration = max(st.Duration, r.Arrival)
		n := r.Prompt.Len()
		st.PromptTokens += int64(n)
		st.OutputTokens += int64(r.Output.Len)
		tokens = r.Prompt.AppendTokens(tokens[:0])
		tokens = r.Output.AppendTokens(tokens)
		seqs = h.AppendSeqHashes(seqs[:0], tokens)
		limit := min((n-1)/bs, len(seqs))
		for j := range limit {
			if _, ok := seen[seqs[j]]; !ok {
				break
			}
			hit += int64(bs)
		}
		for _, s := range seqs {
			seen[s] = struct{}{}
		}
	}
	if st.PromptTokens > 0 {
		st.IdealHitRate = float64(hit) / float64(st.PromptTokens)
	}
	return st, nil
}

// IntRange is an inclusive range of integers drawn uniformly.
type IntRange struct{ Min, Max int }

func (r IntRange) draw(rng *rand.Rand) int {
	if r.Max <= r.Min {
		return r.Min
	}
	return r.Min + rng.IntN(r.Max-r.Min+1)
}

func (r IntRange) or(def IntRange) IntRange {
	if r == (IntRange{}) {
		return def
	}
	return r
}

func (r IntRange) validate(name string, min int) error {
	if r.Min < min || r.Max < r.Min {
		return fmt.Errorf("%w: %s range [%d, %d]", ErrInvalidConfig, name, r.Min, r.Max)
	}
	return nil
}

// Segment kinds: constants mixed into segment seeds so that different
// kinds of content never share tokens.
const (
	kindSystem uint64 = iota + 1
	kindUser
	kindOutput
	kindContext
	kindTool
	kindTraceBlock
)

func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x6b7672_6f757465))
}

// exp draws an exponential duration with the given mean.
func exp(rng *rand.Rand, mean time.Duration) time.Duration {
	return time.Duration(rng.ExpFloat64() * float64(mean))
}

// SharedPrefixConfig configures SharedPrefix: requests that each start
// with one of a set of shared system prompts and end with a user suffix of
// their own, arriving as a Poisson process.
type SharedPrefixConfig struct {
	// Requests is the number of requests. Zero means 10,000.
	Requests int
	// Prompts is the number of distinct system prompts, each used by a
	// request with equal probability. Zero means 50.
	Prompts int
	// Rate is the mean arrival rate in requests per second. Zero means 9.
	Rate float64
	// SystemTokens is the length of each system prompt. Zero means
	// 2,048–6,144.
	SystemTokens IntRange
	// SuffixTokens is the length of each request's own suffix. Zero means
	// 32–256.
	SuffixTokens IntRange
	// OutputTokens is the output length. Zero means 128–512.
	OutputTokens IntRange
	// Seed makes the workload reproducible: equal configurations give equal
	// workloads.
	Seed uint64
}

// SharedPrefix generates workload (a): shared system prompts with user
// suffixes.
func SharedPrefix(cfg SharedPrefixConfig) (*Workload, error) {
	setDefault(&cfg.Requests, 10000)
	setDefault(&cfg.Prompts, 50)
	setDefault(&cfg.Rate, 9)
	cfg.SystemTokens = cfg.SystemTokens.or(IntRange{2048, 6144})
	cfg.SuffixTokens = cfg.SuffixTokens.or(IntRange{32, 256})
	cfg.OutputTokens = cfg.OutputTokens.or(IntRange{128, 512})
	if err := firstError(
		positive("requests", cfg.Requests), positive("prompts", cfg.Prompts), positiveRate(cfg.Rate),
		cfg.SystemTokens.validate("system tokens", 1), cfg.SuffixTokens.validate("suffix tokens", 1),
		cfg.OutputTokens.validate("output tokens", 1),
	); err != nil {
		return nil, err
	}
	rng := newRand(cfg.Seed)
	system := make([]Segment, cfg.Prompts)
	for i := range system {
		system[i] = Segment{Seed: seedOf(kindSystem, cfg.Seed, uint64(i)), Len: cfg.SystemTokens.draw(rng)}
	}
	w := &Workload{Name: "shared-prefix", Requests: make([]Request, cfg.Requests)}
	mean := time.Duration(float64(time.Second) / cfg.Rate)
	var t time.Duration
	for i := range w.Requests {
		t += exp(rng, mean)
		w.Requests[i] = Request{
			Arrival: t,
			Prompt: Prompt{
				system[rng.IntN(cfg.Prompts)],
				{Seed: seedOf(kindUser, cfg.Seed, uint64(i)), Len: cfg.SuffixTokens.draw(rng)},
			},
			Output: Segment{Seed: seedOf(kindOutput, cfg.Seed, uint64(i)), Len: cfg.OutputTokens.draw(rng)},
		}
	}
	return w, nil
}

// ChatConfig configures Chat: multi-turn conversations in which every turn's
// prompt is the previous turn's prompt, its answer and a new user message.
type ChatConfig struct {
	// Requests is the number of requests (turns). Zero means 10,000.
	Requests int
	// Rate is the mean request rate in turns per second; conversations
	// start as a Poisson process at Rate divided by the mean number of
	// turns. Zero means 10.
	Rate float64
	// SystemPrompts is the number of system prompts conversations start
	// with. Zero means 8.
	SystemPrompts int
	// SystemTokens is the length of each system prompt. Zero means
	// 512–2,048.
	SystemTokens IntRange
	// Turns is the number of turns of a conversation. Zero means 2–16.
	Turns IntRange
	// UserTokens is the length of each user message. Zero means 32–512.
	UserTokens IntRange
	// OutputTokens is the length of each answer. Zero means 64–384.
	OutputTokens IntRange
	// ThinkTime is the mean time a user takes to send the next turn after
	// reading the answer. Zero means 10 s.
	ThinkTime time.Duration
	// TokenTime is the answer time per output token the generator assumes
	// when it schedules the next turn. Zero means 30 ms.
	TokenTime time.Duration
	// MaxContext ends a conversation before a turn whose prompt would be
	// longer. Zero means 32,768.
	MaxContext int
	// Seed makes the workload reproducible.
	Seed uint64
}

// Chat generates workload (b): multi-turn chat sessions.
func Chat(cfg ChatConfig) (*Workload, error) {
	setDefault(&cfg.Requests, 10000)
	setDefault(&cfg.Rate, 10)
	setDefault(&cfg.SystemPrompts, 8)
	cfg.SystemTokens = cfg.SystemTokens.or(IntRange{512, 2048})
	cfg.Turns = cfg.Turns.or(IntRange{2, 16})
	cfg.UserTokens = cfg.UserTokens.or(IntRange{32, 512})
	cfg.OutputTokens = cfg.OutputTokens.or(IntRange{64, 384})
	setDefault(&cfg.ThinkTime, 10*time.Second)
	setDefault(&cfg.TokenTime, 30*time.Millisecond)
	setDefault(&cfg.MaxContext, 32768)
	if err := firstError(
		positive("requests", cfg.Requests), positive("system prompts", cfg.SystemPrompts), positiveRate(cfg.Rate),
		cfg.SystemTokens.validate("system tokens", 1), cfg.Turns.validate("turns", 1),
		cfg.UserTokens.validate("user tokens", 1), cfg.OutputTokens.validate("output tokens", 1),
		nonNegative("think time", cfg.ThinkTime), nonNegative("token time", cfg.TokenTime),
	); err != nil {
		return nil, err
	}
	rng := newRand(cfg.Seed)
	system := make([]Segment, cfg.SystemPrompts)
	for i := range system {
		system[i] = Segment{Seed: seedOf(kindSystem, cfg.Seed, uint64(i)), Len: cfg.SystemTokens.draw(rng)}
	}
	meanTurns := float64(cfg.Turns.Min+cfg.Turns.Max) / 2
	sessionGap := time.Duration(float64(time.Second) * meanTurns / cfg.Rate)
	var reqs []Request
	var start time.Duration
	for s := 0; len(reqs) < cfg.Requests; s++ {
		start += exp(rng, sessionGap)
		name := "chat-" + strconv.Itoa(s)
		turns := cfg.Turns.draw(rng)
		ctx := Prompt{system[rng.IntN(len(system))]}
		t := start
		for k := range turns {
			user := Segment{Seed: seedOf(kindUser, cfg.Seed, uint64(s)<<16|uint64(k)), Len: cfg.UserTokens.draw(rng)}
			prompt := append(slices.Clip(ctx), user)
			if prompt.Len() > cfg.MaxContext {
				break
			}
			out := Segment{Seed: seedOf(kindOutput, cfg.Seed, uint64(s)<<16|uint64(k)), Len: cfg.OutputTokens.draw(rng)}
			reqs = append(reqs, Request{Arrival: t, Prompt: prompt, Output: out, Session: name})
			ctx = append(slices.Clip(prompt), out)
			t += time.Duration(out.Len)*cfg.TokenTime + exp(rng, cfg.ThinkTime)
		}
	}
	return finish("chat", reqs, cfg.Requests), nil
}

// AgenticConfig configures Agentic: agents that loop over tool calls on top
// of long shared contexts (tool definitions and instructions). Every step's
// prompt is the previous step's prompt, the model's tool call and the tool's
// result.
type AgenticConfig struct {
	// Requests is the number of requests (steps). Zero means 10,000.
	Requests int
	// Rate is the mean request rate in steps per second; agents start as a
	// Poisson process at Rate divided by the mean number of steps. Zero
	// means 12.
	Rate float64
	// Contexts is the number of distinct shared contexts (agent types).
	// Zero means 6.
	Contexts int
	// ContextTokens is the length of each shared context. Zero means
	// 4,096–12,288.
	ContextTokens IntRange
	// TaskTokens is the length of each agent's own task description. Zero
	// means 128–1,024.
	TaskTokens IntRange
	// Steps is the number of steps of an agent. Zero means 4–20.
	Steps IntRange
	// ToolCallTokens is the length of each model output (a tool call).
	// Zero means 16–160.
	ToolCallTokens IntRange
	// ToolResultTokens is the length of each tool result. Zero means
	// 64–1,536.
	ToolResultTokens IntRange
	// ToolLatency is the mean time a tool takes. Zero means 1 s.
	ToolLatency time.Duration
	// TokenTime is the output time per token the generator assumes when it
	// schedules the next step. Zero means 30 ms.
	TokenTime time.Duration
	// MaxContext ends an agent before a step whose prompt would be longer.
	// Zero means 32,768.
	MaxContext int
	// Seed makes the workload reproducible.
	Seed uint64
}

// Agentic generates workload (c): agentic tool loops with long shared
// contexts.
func Agentic(cfg AgenticConfig) (*Workload, error) {
	setDefault(&cfg.Requests, 10000)
	setDefault(&cfg.Rate, 12)
	setDefault(&cfg.Contexts, 6)
	cfg.ContextTokens = cfg.ContextTokens.or(IntRange{4096, 12288})
	cfg.TaskTokens = cfg.TaskTokens.or(IntRange{128, 1024})
	cfg.Steps = cfg.Steps.or(IntRange{4, 20})
	cfg.ToolCallTokens = cfg.ToolCallTokens.or(IntRange{16, 160})
	cfg.ToolResultTokens = cfg.ToolResultTokens.or(IntRange{64, 1536})
	setDefault(&cfg.ToolLatency, time.Second)
	setDefault(&cfg.TokenTime, 30*time.Millisecond)
	setDefault(&cfg.MaxContext, 32768)
	if err := firstError(
		positive("requests", cfg.Requests), positive("contexts", cfg.Contexts), positiveRate(cfg.Rate),
		cfg.ContextTokens.validate("context tokens", 1), cfg.TaskTokens.validate("task tokens", 1),
		cfg.Steps.validate("steps", 1), cfg.ToolCallTokens.validate("tool call tokens", 1),
		cfg.ToolResultTokens.validate("tool result tokens", 1),
		nonNegative("tool latency", cfg.ToolLatency), nonNegative("token time", cfg.TokenTime),
	); err != nil {
		return nil, err
	}
	rng := newRand(cfg.Seed)
	contexts := make([]Segment, cfg.Contexts)
	for i := range contexts {
		contexts[i] = Segment{Seed: seedOf(kindContext, cfg.Seed, uint64(i)), Len: cfg.ContextTokens.draw(rng)}
	}
	meanSteps := float64(cfg.Steps.Min+cfg.Steps.Max) / 2
	agentGap := time.Duration(float64(time.Second) * meanSteps / cfg.Rate)
	var reqs []Request
	var start time.Duration
	for a := 0; len(reqs) < cfg.Requests; a++ {
		start += exp(rng, agentGap)
		name := "agent-" + strconv.Itoa(a)
		steps := cfg.Steps.draw(rng)
		prompt := Prompt{
			contexts[rng.IntN(len(contexts))],
			{Seed: seedOf(kindUser, cfg.Seed, uint64(a)), Len: cfg.TaskTokens.draw(rng)},
		}
		t := start
		for k := range steps {
			if prompt.Len() > cfg.MaxContext {
				break
			}
			out := Segment{Seed: seedOf(kindOutput, cfg.Seed, uint64(a)<<16|uint64(k)), Len: cfg.ToolCallTokens.draw(rng)}
			reqs = append(reqs, Request{Arrival: t, Prompt: prompt, Output: out, Session: name})
			result := Segment{Seed: seedOf(kindTool, cfg.Seed, uint64(a)<<16|uint64(k)), Len: cfg.ToolResultTokens.draw(rng)}
			prompt = append(slices.Clip(prompt), out, result)
			t += time.Duration(out.Len)*cfg.TokenTime + exp(rng, cfg.ToolLatency)
		}
	}
	return finish("agentic", reqs, cfg.Requests), nil
}

// finish sorts requests by arrival (stably, so equal times keep their
// generation order) and keeps the first n.
func finish(name string, reqs []Request, n int) *Workload {
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmpDuration(a.Arrival, b.Arrival) })
	return &Workload{Name: name, Requests: slices.Clip(reqs[:min(n, len(reqs))])}
}

func cmpDuration(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func positive(name string, v int) error {
	if v <= 0 {
		return fmt.Errorf("%w: %s must be positive, got %d", ErrInvalidConfig, name, v)
	}
	return nil
}

func positiveRate(r float64) error {
	if !(r > 0) || r > 1e9 {
		return fmt.Errorf("%w: rate must be positive, got %g", ErrInvalidConfig, r)
	}
	return nil
}

func nonNegative(name string, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%w: %s must not be negative, got %s", ErrInvalidConfig, name, d)
	}
	return nil
}
