// Command kvsim runs the kvroute simulator: a workload on a simulated
// cluster, once per routing policy, and prints the comparison.
//
// Usage:
//
//	go run ./bench/cmd/kvsim -workload a -policy all -requests 10000 -seed 1 -format table
//
// Workloads: a (shared system prompts), b (multi-turn chat), c (agentic tool
// loops), d (Mooncake trace replay; -trace names the JSONL file, by default
// ../shared/traces/mooncake_synthetic_trace.jsonl from the repository root),
// e and f (bench/dynamo's shared-prompt scenarios on engines timed as NVIDIA
// Dynamo's mocker engines).
// Policies: all, or a comma-separated list of random, round-robin,
// least-loaded, weighted, dynamo, kvroute. Formats: table, csv, json.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/kvroute/kvroute/bench"
)

const defaultTrace = "../shared/traces/mooncake_synthetic_trace.jsonl"

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "kvsim:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvsim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	workload := fs.String("workload", "a", "workload: a to f (e and f: Dynamo mocker scenarios)")
	policies := fs.String("policy", "all", "policies: all or a comma-separated list")
	requests := fs.Int("requests", 0, "number of requests (0: the workload's default)")
	seed := fs.Uint64("seed", 1, "seed of the workload and the router")
	format := fs.String("format", "table", "output format: table, csv or json")
	trace := fs.String("trace", defaultTrace, "Mooncake JSONL trace for workload d")
	speed := fs.Float64("speed", 0, "Mooncake replay speed factor (0: the scenario's default)")
	quiet := fs.Bool("q", false, "no progress on stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var pols []bench.Policy
	if *policies == "all" {
		pols = bench.Policies()
	} else {
		for _, name := range strings.Split(*policies, ",") {
			p, err := bench.PolicyByName(strings.TrimSpace(name))
			if err != nil {
				return err
			}
			pols = append(pols, p)
		}
	}
	sc, err := bench.NewScenario(*workload, bench.ScenarioOptions{Requests: *requests, Seed: *seed, TracePath: *trace, Speed: *speed})
	if err != nil {
		return err
	}
	if !*quiet {
		sc.Config.Progress = bench.ProgressPrinter(stderr, fmt.Sprintf("workload %s (%s), %d policies", sc.Name, sc.Workload.Name, len(pols)))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	results, err := bench.Compare(ctx, sc.Config, sc.Workload, pols, 0)
	if err != nil {
		return err
	}
	return bench.Write(stdout, *format, results)
}
