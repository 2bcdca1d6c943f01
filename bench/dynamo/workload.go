package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// words is the vocabulary of the generated prompts. mkmodel.py trains the
// tokenizer on the same words, so each costs one token (a leading space
// included) and a prompt's length in tokens is its length in words plus the
// chat template's few tokens.
var words = strings.Fields(`the of and to in is you that it he was for on are as with his they at be this
have from or one had by word but not what all were we when your can said there use an each
which she do how their if will up other about out many then them these so some her would make
like him into time has look two more write go see number no way could people my than first
water been call who oil its now find long down day did get come made may part system assistant
user router cache token model prompt request worker block prefix engine query answer context
document section table result value field record server client index event stream batch queue`)

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Request is one chat completion of a workload.
type Request struct {
	// Conv is the conversation the request belongs to and Turn its place
	// in it; a turn is sent only after the previous turn of its
	// conversation finished.
	Conv, Turn int
	// Prefix is the shared system prompt the request starts with.
	Prefix   int
	Messages []Message
	// MaxTokens is the number of tokens the engine generates.
	MaxTokens int
}

// Scenario is a workload and the deployment it runs on.
type Scenario struct {
	Name        string
	Description string
	// CacheBlocks is each worker's KV capacity (--num-gpu-blocks-override).
	CacheBlocks int
	Concurrency int
	Requests    []Request
}

// ScenarioNames lists the scenarios in table order.
var ScenarioNames = []string{"prompts-1.6k", "prompts-6k", "multi-turn"}

// scenarioConfig holds the knobs of NewScenario.
type scenarioConfig struct {
	requests    int // shared-prompt scenarios: chats; multi-turn: conversations × turns
	concurrency int
	seed        uint64
}

// NewScenario builds the named scenario. The same name, request count and
// seed give the same requests, so every arm serves the same workload.
func NewScenario(name string, cfg scenarioConfig) (*Scenario, error) {
	if cfg.requests <= 0 || cfg.concurrency <= 0 {
		return nil, fmt.Errorf("scenario %s: requests and concurrency must be positive", name)
	}
	rng := rand.New(rand.NewPCG(cfg.seed, 0x6b76726f757465))
	switch name {
	case "prompts-1.6k":
		return sharedPrompts(name, rng, cfg, 1500, 100, 800), nil
	case "prompts-6k":
		return sharedPrompts(name, rng, cfg, 5900, 100, 2000), nil
	case "multi-turn":
		return multiTurn(name, rng, cfg), nil
	}
	return nil, fmt.Errorf("unknown scenario %q (known: %s)", name, strings.Join(ScenarioNames, ", "))
}

// sharedPrompts is cfg.requests streaming chats, each a system prompt of
// systemWords drawn uniformly from 20 and a user question of userWords of
// its own.
func sharedPrompts(name string, rng *rand.Rand, cfg scenarioConfig, systemWords, userWords, blocks int) *Scenario {
	const prompts = 20
	systems := make([]string, prompts)
	for i := range systems {
		systems[i] = fmt.Sprintf("You are assistant %d. %s", i, text(rng, systemWords))
	}
	s := &Scenario{
		Name: name,
		Description: fmt.Sprintf("%d chats, %d shared system prompts of about %d tokens plus a %d-token question, %d blocks per worker, concurrency %d",
			cfg.requests, prompts, systemWords, userWords, blocks, cfg.concurrency),
		CacheBlocks: blocks,
		Concurrency: cfg.concurrency,
	}
	for i := range cfg.requests {
		p := rng.IntN(prompts)
		s.Requests = append(s.Requests, Request{
			Conv: i, Prefix: p, MaxTokens: 64,
			Messages: []Message{
				{Role: "system", Content: systems[p]},
				{Role: "user", Content: fmt.Sprintf("Question %d: %s", i, text(rng, userWords))},
			},
		})
	}
	return s
}

// multiTurn is conversations of 6 turns over 8 system prompts of about
// 1,000 tokens; each turn adds a 150-token user message and the previous
// turn's 100-token assistant reply (a fixed text per turn, so that every
// arm sends the same prompts). At most Concurrency conversations are open
// at once; a conversation's next turn follows its previous one, so the
// turns of many conversations interleave and each one's history grows to
// about 2,500 tokens. 1,000 blocks per worker hold about a quarter of the
// open histories: the cache is the constraint.
func multiTurn(name string, rng *rand.Rand, cfg scenarioConfig) *Scenario {
	const prompts, turns = 8, 6
	systems := make([]string, prompts)
	for i := range systems {
		systems[i] = fmt.Sprintf("You are agent %d. %s", i, text(rng, 1000))
	}
	convs := max(cfg.requests/turns, 1)
	s := &Scenario{
		Name: name,
		Description: fmt.Sprintf("%d conversations of %d turns (+150 user, +100 assistant tokens a turn) over %d system prompts of about 1,000 tokens, 1000 blocks per worker, %d conversations at once",
			convs, turns, prompts, cfg.concurrency),
		CacheBlocks: 1000,
		Concurrency: cfg.concurrency,
	}
	for c := range convs {
		p := rng.IntN(prompts)
		hist := []Message{{Role: "system", Content: systems[p]}}
		for t := range turns {
			hist = append(hist, Message{Role: "user", Content: fmt.Sprintf("Turn %d of %d: %s", t, c, text(rng, 150))})
			s.Requests = append(s.Requests, Request{Conv: c, Turn: t, Prefix: p, MaxTokens: 100, Messages: append([]Message(nil), hist...)})
			hist = append(hist, Message{Role: "assistant", Content: text(rng, 100)})
		}
	}
	return s
}

// text returns n words drawn from words.
func text(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()
}
