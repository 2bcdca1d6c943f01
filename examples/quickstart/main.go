// Command quickstart is kvroute's first stop: it simulates a cluster of four
// inference engines serving requests that share 50 system prompts, routes
// the same 10,000 requests with every policy (cache-blind baselines, the
// classic weighted score, NVIDIA Dynamo's default cost and kvroute's best
// configuration) and prints how each did: KV-cache hit rate, time to first
// token, end-to-end latency, throughput, load balance and router time per
// decision.
//
// Run it from the repository root:
//
//	go run ./examples/quickstart
//
// The engines are simulated in virtual time (package bench), but the router
// is the real one: it is fed the engines' KV events through the vLLM wire
// codec and decides with router.Router.SelectInto, exactly as a gateway
// would. Flags: -requests, -seed, -format (table, csv, json).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/kvroute/kvroute/bench"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	requests := fs.Int("requests", 10000, "number of requests")
	seed := fs.Uint64("seed", 1, "seed of the workload and the router")
	format := fs.String("format", "table", "output format: table, csv or json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sc, err := bench.NewScenario("a", bench.ScenarioOptions{Requests: *requests, Seed: *seed})
	if err != nil {
		return err
	}
	policies := bench.Policies()
	fmt.Fprintf(stderr, "%d engines, %d requests over %d shared system prompts, %d policies\n",
		sc.Config.Workers, len(sc.Workload.Requests), 50, len(policies))
	sc.Config.Progress = bench.ProgressPrinter(stderr, "simulating")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	results, err := bench.Compare(ctx, sc.Config, sc.Workload, policies, 0)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "done in %s\n\n", time.Since(start).Round(100*time.Millisecond))
	if err := bench.Write(stdout, *format, results); err != nil {
		return err
	}
	if *format == "table" {
		fmt.Fprintln(stdout)
		for _, p := range policies {
			fmt.Fprintf(stdout, "%-13s %s\n", p.Name, p.Description)
		}
	}
	return nil
}
