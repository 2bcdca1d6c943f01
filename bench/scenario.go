package bench

import (
	"fmt"
	"time"
)

// ScenarioOptions adjust a named scenario.
type ScenarioOptions struct {
	// Requests is the number of requests. Zero means the scenario's
	// default (10,000 for the generated workloads, the whole trace for
	// Mooncake).
	Requests int
	// Seed seeds the workload and the router.
	Seed uint64
	// TracePath is the Mooncake JSONL trace (scenario "d").
	TracePath string
	// Speed is the Mooncake replay speed factor. Zero means the scenario's
	// default.
	Speed float64
}

// Scenario is a calibrated cluster and workload: engines sized so that the
// caches cannot hold every prefix and the cluster is loaded but not
// overloaded.
type Scenario struct {
	// Name is the scenario's letter: "a" to "f".
	Name string
	// Config is the cluster.
	Config Config
	// Workload is the workload.
	Workload *Workload
}

// ScenarioNames lists the scenarios NewScenario knows.
func ScenarioNames() []string { return []string{"a", "b", "c", "d", "e", "f"} }

// NewScenario builds the named scenario:
//
//   - "a": SharedPrefix with its defaults (50 system prompts of 2–6K tokens,
//     Poisson arrivals) on 4 engines;
//   - "b": Chat, multi-turn conversations, on 4 engines;
//   - "c": Agentic, tool loops over long shared contexts, on 4 engines;
//   - "d": the Mooncake trace at opts.TracePath, replayed faster than
//     recorded, on 8 engines;
//   - "e" and "f": the shared-prompt scenarios of the end-to-end benchmark
//     on NVIDIA Dynamo's mocker engines (bench/dynamo), prompts-1.6k and
//     prompts-6k, in virtual time: 20 system prompts of 1,504 (e) or 5,904
//     (f) tokens, each request one of them plus a 128-token question of its
//     own and 64 output tokens, 200 requests from 8 closed-loop clients, on
//     4 engines of 800 (e) or 2,000 (f) blocks of 16 tokens with the
//     mocker's timing (TimingDynamoMocker).
func NewScenario(name string, opts ScenarioOptions) (*Scenario, error) {
	s := &Scenario{Name: name, Config: Config{Seed: opts.Seed}}
	var err error
	switch name {
	case "a":
		s.Config.Workers = 4
		s.Config.Engine = EngineConfig{CacheBlocks: 4096, PrefillTokensPerSecond: 20000, MaxBatch: 64}
		s.Workload, err = SharedPrefix(SharedPrefixConfig{Requests: opts.Requests, Seed: opts.Seed})
	case "b":
		s.Config.Workers = 4
		s.Config.Engine = EngineConfig{CacheBlocks: 8192, PrefillTokensPerSecond: 20000, MaxBatch: 64}
		s.Workload, err = Chat(ChatConfig{Requests: opts.Requests, Seed: opts.Seed})
	case "c":
		s.Config.Workers = 4
		s.Config.Engine = EngineConfig{CacheBlocks: 12288, PrefillTokensPerSecond: 20000, MaxBatch: 64}
		s.Workload, err = Agentic(AgenticConfig{Requests: opts.Requests, Seed: opts.Seed})
	case "d":
		if opts.TracePath == "" {
			return nil, fmt.Errorf("%w: scenario d needs a Mooncake trace path", ErrInvalidConfig)
		}
		speed := opts.Speed
		if speed == 0 {
			speed = 2
		}
		s.Config.Workers = 8
		s.Config.Engine = EngineConfig{CacheBlocks: 32768, PrefillTokensPerSecond: 40000, MaxBatchedTokens: 16384, MaxBatch: 64}
		var recs []TraceRecord
		if recs, err = ReadMooncakeFile(opts.TracePath); err == nil {
			s.Workload, err = FromMooncake(recs, MooncakeConfig{Speed: speed, Limit: opts.Requests})
		}
	case "e", "f":
		system, blocks := 1504, 800
		if name == "f" {
			system, blocks = 5904, 2000
		}
		requests := opts.Requests
		setDefault(&requests, 200)
		s.Config.Workers = 4
		s.Config.BlockSize = 16
		s.Config.Concurrency = 8
		s.Config.EventDelay = 2 * time.Millisecond
		s.Config.Engine = EngineConfig{CacheBlocks: blocks, MaxBatch: 256, Timing: TimingDynamoMocker}
		s.Workload, err = SharedPrefix(SharedPrefixConfig{
			Requests: requests, Prompts: 20, Seed: opts.Seed,
			SystemTokens: IntRange{system, system}, SuffixTokens: IntRange{128, 128}, OutputTokens: IntRange{64, 64},
		})
	default:
		return nil, fmt.Errorf("%w: unknown scenario %q (a to f)", ErrInvalidConfig, name)
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}
