// Command dynamo is kvroute's end-to-end routing benchmark on NVIDIA
// Dynamo 1.6.1: four of Dynamo's mocker engines (simulated vLLM workers
// with a real prefix cache that publish real KV events) behind Dynamo's
// frontend, driven with streaming chats through three arms:
//
//   - dynamo-kv: Dynamo's own KV router (frontend --router-mode kv), default
//     configuration;
//   - round-robin: the frontend's round-robin router;
//   - kvroute: kvroute's gateway (examples/gateway) in its Dynamo mode with
//     its default configuration, in front of the frontend in
//     --router-mode direct.
//
// Every run starts a fresh deployment (new workers, empty caches) on
// 127.0.0.1 and stops every process by its pid afterwards. Arms alternate
// within each repetition. For each run it prints TTFT p50/p99, throughput,
// the cached fraction of prompt tokens (from the usage the workers report),
// requests per worker and, for kvroute, how often its predicted cached
// tokens matched the engine's; then a table of medians per scenario.
//
// Usage (from the repository root):
//
//	go run ./bench/dynamo -venv /path/to/venv
//
// The venv is created and Dynamo installed into it (pip, from PyPI) when it
// has no Dynamo yet. See bench/dynamo/README.md for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	if err := mainErr(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "dynamo:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	venv, dir, model, gateway string
	scenarios, arms           []string
	reps, requests, conc      int
	workers                   int
	seed                      uint64
	keep                      bool
	gatewayArgs               string
	libPolicy                 string
	delayedAcks               bool
}

func mainErr(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dynamo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var scen, arms string
	fs.StringVar(&o.venv, "venv", ".dynamo-venv", "Python venv with Dynamo 1.6.1; created and installed when it has no Dynamo")
	fs.StringVar(&o.dir, "dir", "", "working directory for the model, file stores and logs (default: a new temporary directory)")
	fs.StringVar(&o.model, "model", "", "tokenizer-only model directory (default: DIR/model, made by mkmodel.py)")
	fs.StringVar(&scen, "scenarios", strings.Join(ScenarioNames, ","), "comma-separated scenarios")
	fs.StringVar(&arms, "arms", "dynamo-kv,round-robin,kvroute", "comma-separated arms: dynamo-kv, round-robin, kvroute, kvroute-lib, kvroute-lib:POLICY")
	fs.IntVar(&o.reps, "reps", 3, "repetitions of each (scenario, arm)")
	fs.IntVar(&o.requests, "requests", 200, "requests per run")
	fs.IntVar(&o.conc, "concurrency", 8, "requests (conversations) in flight")
	fs.IntVar(&o.workers, "workers", 4, "mocker workers")
	fs.Uint64Var(&o.seed, "seed", 1, "workload seed")
	fs.StringVar(&o.gateway, "gateway", "", "kvroute gateway binary (default: go build ./examples/gateway into DIR)")
	fs.StringVar(&o.gatewayArgs, "gateway-args", "", "extra gateway flags, space-separated (default: none, the default configuration)")
	fs.StringVar(&o.libPolicy, "lib-policy", "default", "policy of the kvroute-lib arm: "+strings.Join(libPolicyNames(), ", "))
	fs.BoolVar(&o.keep, "keep", false, "keep the working directory")
	fs.BoolVar(&o.delayedAcks, "client-delayed-acks", false, "let the client's kept-alive connections delay their TCP acknowledgements (Linux's default), which holds back every first token faster than about 40 ms sent by Dynamo's frontend")
	verbose := fs.Bool("v", false, "log each process start and stop")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.scenarios, o.arms = split(scen), split(arms)
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.dir == "" {
		d, err := os.MkdirTemp("", "kvroute-dynamo-")
		if err != nil {
			return err
		}
		o.dir = d
		if !o.keep {
			defer os.RemoveAll(d)
		}
	}
	var err error
	if o.dir, err = filepath.Abs(o.dir); err != nil {
		return err
	}
	b := &bench{o: o, log: log, out: stdout}
	return b.run(ctx)
}

func split(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// bench runs the benchmark.
type bench struct {
	o      options
	log    *slog.Logger
	out    io.Writer
	python string
	script string               // mkmodel.py
	sums   map[string][]Summary // scenario/arm → summaries
	// arrivals merges the Arrivals of every repetition: scenario/arm → its.
	arrivals map[string]*Arrivals
	lib      libState
}

func (b *bench) run(ctx context.Context) error {
	here, err := sourceDir()
	if err != nil {
		return err
	}
	b.script = filepath.Join(here, "mkmodel.py")
	if b.python, err = ensureVenv(ctx, b.o.venv, b.log); err != nil {
		return err
	}
	if b.o.model == "" {
		b.o.model = filepath.Join(b.o.dir, "model")
	}
	if err := ensureModel(ctx, b.python, b.script, b.o.model); err != nil {
		return err
	}
	for _, a := range b.o.arms {
		if _, ok := armSpecOf(a); !ok {
			return fmt.Errorf("unknown arm %q", a)
		}
	}
	if err := b.prepareArms(ctx); err != nil {
		return err
	}
	var scens []*Scenario
	for _, name := range b.o.scenarios {
		s, err := NewScenario(name, scenarioConfig{requests: b.o.requests, concurrency: b.o.conc, seed: b.o.seed})
		if err != nil {
			return err
		}
		scens = append(scens, s)
	}
	b.sums = map[string][]Summary{}
	b.arrivals = map[string]*Arrivals{}
	fmt.Fprintf(b.out, "kvroute vs Dynamo 1.6.1 mocker, %s, %d workers, block 16, %d reps\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), b.o.workers, b.o.reps)
	for rep := range b.o.reps {
		for si, s := range scens {
			// Rotate the arm order from one (repetition, scenario) to the
			// next, so that no arm always runs first or last.
			n := len(b.o.arms)
			for k := range n {
				arm := b.o.arms[(k+rep+si)%n]
				if err := b.one(ctx, s, arm, rep); err != nil {
					return fmt.Errorf("%s/%s rep %d: %w", s.Name, arm, rep+1, err)
				}
			}
		}
	}
	b.table(scens)
	return nil
}

// one runs scenario s through arm once on a fresh deployment.
func (b *bench) one(ctx context.Context, s *Scenario, arm string, rep int) error {
	spec, _ := armSpecOf(arm)
	port, err := freePort()
	if err != nil {
		return err
	}
	dir := filepath.Join(b.o.dir, fmt.Sprintf("%s-%s-%d", s.Name, arm, rep+1))
	d, err := Deploy(ctx, deployConfig{
		python: b.python, model: b.o.model, dir: dir, workers: b.o.workers,
		cacheBlocks: s.CacheBlocks, httpPort: port, routerMode: spec.routerMode,
		scenario: s,
	}, b.log)
	if err != nil {
		return err
	}
	defer d.Stop()
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	var ch Chooser
	if spec.setup != nil {
		if url, ch, err = spec.setup(ctx, b, d, port); err != nil {
			return err
		}
	}
	run, err := drive(ctx, url, s, ch, !b.o.delayedAcks)
	if err != nil {
		return err
	}
	run.Arm, run.Rep = arm, rep+1
	if err := run.WriteJSONL(filepath.Join(dir, "requests.jsonl")); err != nil {
		return err
	}
	sum := run.Summarize(b.o.workers, 16)
	key := s.Name + "/" + arm
	b.sums[key] = append(b.sums[key], sum)
	if b.arrivals[key] == nil {
		b.arrivals[key] = &Arrivals{}
	}
	b.arrivals[key].add(run.arrivals())
	fmt.Fprintf(b.out, "%-13s %-12s rep %d: TTFT p50 %6.1f ms p99 %6.1f ms, %5.2f req/s, cached %.3f, per worker %v, uneven %.0f%% of the time%s\n",
		s.Name, arm, rep+1, ms(sum.TTFTp50), ms(sum.TTFTp99), sum.Throughput, sum.CachedFraction, sum.PerWorker, 100*sum.Uneven, accuracy(sum))
	return nil
}

// armSpec is how an arm is deployed: the frontend's router mode and, for
// kvroute's arms, what it starts in front of the frontend.
type armSpec struct {
	routerMode string
	// setup returns the URL to send chats to and the in-process chooser,
	// if any.
	setup func(ctx context.Context, b *bench, d *Deployment, frontendPort int) (string, Chooser, error)
}

var arms = map[string]armSpec{
	"dynamo-kv":   {routerMode: "kv"},
	"round-robin": {routerMode: "round-robin"},
	"kvroute":     {routerMode: "direct", setup: setupGateway},
	"kvroute-lib": {routerMode: "direct", setup: setupLib},
}

// armSpecOf returns the spec of an arm; "kvroute-lib:POLICY" is the
// in-process arm with a policy other than -lib-policy's.
func armSpecOf(name string) (armSpec, bool) {
	if p, ok := strings.CutPrefix(name, "kvroute-lib:"); ok {
		if !knownLibPolicy(p) {
			return armSpec{}, false
		}
		return armSpec{routerMode: "direct", setup: func(ctx context.Context, b *bench, d *Deployment, port int) (string, Chooser, error) {
			return setupLibPolicy(ctx, b, d, p)
		}}, true
	}
	s, ok := arms[name]
	return s, ok
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func accuracy(s Summary) string {
	if s.Predicted == 0 {
		return ""
	}
	return fmt.Sprintf(", predicted within a block %d/%d (predicted %d, actual %d tokens)", s.Exact, s.Predicted, s.PredictedTokens, s.ActualTokens)
}

// sourceDir returns bench/dynamo's directory: the command runs from the
// repository root (go run ./bench/dynamo) or from its own directory.
func sourceDir() (string, error) {
	for _, d := range []string{"bench/dynamo", "."} {
		if _, err := os.Stat(filepath.Join(d, "mkmodel.py")); err == nil {
			return filepath.Abs(d)
		}
	}
	return "", errors.New("mkmodel.py not found: run from the repository root")
}
