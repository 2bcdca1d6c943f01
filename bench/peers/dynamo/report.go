package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/stats"
)

// label describes a timed section in the report.
func (r *row) label(o options) string {
	trace := "Mooncake sample"
	if filepath.Base(o.trace) != "mooncake_sample.jsonl" {
		trace = filepath.Base(o.trace)
	}
	tc := defaultTree().scaled(o.scale)
	switch r.Workload + "/" + r.Section {
	case "tree/" + secHot:
		return fmt.Sprintf("%s blocks, %d workers, %d-block query, hot", millions(tc.Chains*tc.ChainLen), tc.Workers, tc.QueryLen)
	case "tree/" + secCold:
		return "same, cold (uniformly random stored prefixes)"
	case "tree/" + secPartial:
		return "same, partial prefix"
	case "tree/" + secApply:
		return fmt.Sprintf("apply %s new stored blocks", millions(tc.ApplyChains*tc.ChainLen))
	case "trace-lru/" + secReplay:
		return fmt.Sprintf("%s replay, %d workers, match + store, LRU evictions", trace, defaultTrace(evictLRU).Workers)
	case "trace-random/" + secReplay:
		return "same, random (mid-chain) evictions"
	case "trace-lru-warm/" + secSteady:
		return fmt.Sprintf("same, LRU evictions, steady state: the second half after the first half untimed (%d workers' caches full)", defaultTrace(evictLRU).Workers)
	case "trace-random-warm/" + secSteady:
		return "same, random evictions, steady state"
	case "hash/" + secHash:
		return "chained hashing, 4,096 tokens"
	}
	return r.Workload + "/" + r.Section
}

// millions formats a count of about a million or less as "1M", "0.05M".
func millions(n int) string { return fmt.Sprintf("%.3gM", float64(n)/1e6) }

func (r *row) unit() string {
	switch {
	case r.Workload == "tree" && r.Section == secApply:
		return "block"
	case r.Metric == perBlockOp:
		return "block-op"
	case r.Workload == "hash":
		return "op"
	}
	return "query"
}

// duration formats nanoseconds as ns below 1 µs and µs above.
func duration(ns float64) string {
	if ns >= 1000 {
		return fmt.Sprintf("%.2f µs", ns/1000)
	}
	return fmt.Sprintf("%.0f ns", ns)
}

// writeReport prints the timing and correctness tables as Markdown.
func writeReport(w io.Writer, rows []row, checks []check, o options, took time.Duration) {
	fmt.Fprintf(w, "\nkvroute vs Dynamo RadixTree (dynamo-kv-router 1.6.1), %s, %s, %d CPUs, %s, kvroute GOMAXPROCS %s, %d pairs (%d per replay, each of %d passes), scale %g, %s time\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), cpuModel(), runtime.NumCPU(), runtime.Version(), procsText(o.procs), o.pairs, o.replayPairs, o.replayPasses, o.scale, clockText(o.clock))
	fmt.Fprintln(w, "| workload | unit | kvroute (median) | Dynamo (median) | ratio kvroute/Dynamo (median) | ratio min–max |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for i := range rows {
		r := &rows[i]
		n := min(len(r.Times[kvSide]), len(r.Times[dynSide]))
		ratios := make([]float64, n)
		for p := range n {
			if d := r.Times[dynSide][p]; d > 0 {
				ratios[p] = r.Times[kvSide][p] / d
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %.2f | %.2f–%.2f |\n", r.label(o), r.unit(),
			duration(stats.Median(r.Times[kvSide])), duration(stats.Median(r.Times[dynSide])),
			stats.Median(ratios), slices.Min(ratios), slices.Max(ratios))
	}
	fmt.Fprintln(w, "\nAnswers that differ from the ground truth (overlap of every worker per query, or the hashes), events a side rejected, and the blocks of the Stored events among them (work the side skipped):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| workload/section | answers | kvroute mismatches | Dynamo mismatches | kvroute event errors | Dynamo event errors | kvroute rejected stored blocks | Dynamo rejected stored blocks |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, c := range checks {
		fmt.Fprintf(w, "| %s/%s | %d | %d | %d | %d | %d | %d | %d |\n", c.Workload, c.Section, c.Answers,
			c.Mismatches[kvSide], c.Mismatches[dynSide], c.Errors[kvSide], c.Errors[dynSide],
			c.RejectedBlocks[kvSide], c.RejectedBlocks[dynSide])
	}
	for _, c := range checks {
		if c.FirstErr != "" {
			fmt.Fprintf(w, "\nkvroute's first event error in %s/%s: %s\n", c.Workload, c.Section, c.FirstErr)
		}
	}
	fmt.Fprintf(w, "\ntotal time %v\n", took.Round(time.Second))
}

func procsText(p int) string {
	if p <= 0 {
		return fmt.Sprint(runtime.GOMAXPROCS(0))
	}
	return fmt.Sprint(p)
}

// cpuModel returns the CPU's model name from /proc/cpuinfo, or the
// architecture when it is not available.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

// repoRoot finds the kvroute module root from the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("peers: %w", err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/kvroute/kvroute\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("peers: run from inside the kvroute repository (no go.mod of github.com/kvroute/kvroute above the working directory)")
		}
		dir = parent
	}
}
