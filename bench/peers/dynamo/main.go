// Command dynamo compares kvroute's prefix index with the radix tree of
// NVIDIA Dynamo's KV router (crate dynamo-kv-router 1.6.1, RadixTree) on
// the same generated workloads, and checks both against a ground-truth
// model.
//
// It generates the workload files, builds the Rust side with cargo (or
// takes -rust-bin), then for each workload runs the two sides alternately
// -pairs times: kvroute in this process through the public API of package
// indexer, Dynamo as a subprocess reading the same file. It prints, per
// timed section, both medians and the ratio kvroute/Dynamo (median, min and
// max over the pairs), and per section the number of answers that differ
// from the ground truth. A kvroute mismatch makes it exit with status 1;
// Dynamo's are only reported.
//
// Run it from the repository root:
//
//	go run ./bench/peers/dynamo
//
// See README.md beside this file for the workloads and the options.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// errMismatch is returned when kvroute disagrees with the ground truth.
var errMismatch = errors.New("peers: kvroute answers differ from the ground truth")

// options are the command's flags.
type options struct {
	rustBin   string
	targetDir string
	dir       string
	keep      bool
	pairs     int
	// replayPairs replaces pairs for the trace replays.
	replayPairs int
	// replayPasses is how many times each side runs a trace replay per
	// pair, each time on a new index.
	replayPasses int
	workloads    string
	scale        float64
	trace        string
	capacity     int
	// reserve has kvroute's index make room for each worker's cache of
	// capacity blocks in the replays (indexer.Config.WorkerBlocks).
	reserve bool
	procs   int
	clock   string
	profile string
	memProf string
}

// allWorkloads names the default workloads in the order they run.
var allWorkloads = []string{"tree", "trace-lru", "trace-random", "hash"}

// extraWorkloads run only when named in -workloads.
var extraWorkloads = []string{"trace-lru-warm", "trace-random-warm"}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	var o options
	fs := flag.NewFlagSet("dynamo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.rustBin, "rust-bin", "", "the built Dynamo side (default: cargo build --release in bench/peers/dynamo/rust)")
	fs.StringVar(&o.targetDir, "target-dir", filepath.Join(root, "bench/peers/dynamo/rust/target"), "CARGO_TARGET_DIR for the build")
	fs.StringVar(&o.dir, "dir", "", "directory for the workload files (default: a temporary directory, removed at the end)")
	fs.BoolVar(&o.keep, "keep", false, "keep the workload files")
	fs.IntVar(&o.pairs, "pairs", 7, "alternating runs of the two sides per workload")
	fs.IntVar(&o.replayPairs, "replay-pairs", 21, "alternating runs of the two sides per trace replay")
	fs.IntVar(&o.replayPasses, "replay-passes", 10, "passes of a trace replay in each run of a side, each on a new index (a pass takes a few milliseconds); the run's time is their sum")
	fs.StringVar(&o.workloads, "workloads", strings.Join(allWorkloads, ","), "comma-separated workloads to run; also "+strings.Join(extraWorkloads, ", ")+" (the replays' second half, timed after the first half warmed the index)")
	fs.Float64Var(&o.scale, "scale", 1, "multiply the workload sizes (the tree and hashing workloads)")
	fs.StringVar(&o.trace, "trace", filepath.Join(root, "bench/testdata/mooncake_sample.jsonl"), "Mooncake trace for the replay workloads")
	fs.IntVar(&o.capacity, "capacity", defaultTrace(evictLRU).Capacity, "blocks per worker cache in the replay workloads")
	fs.BoolVar(&o.reserve, "reserve", true, "in the replays, kvroute's index makes room for each worker's cache of -capacity blocks (indexer.Config.WorkerBlocks), as a router does for workers that report their KV capacity; false starts every worker's map small")
	fs.IntVar(&o.procs, "procs", 1, "GOMAXPROCS while kvroute runs (0: leave it); the Dynamo side is single-threaded")
	fs.StringVar(&o.clock, "clock", clockWall, "what the ratios compare: wall (elapsed time) or cpu (each side's process CPU time, which other jobs on a busy machine inflate less)")
	fs.StringVar(&o.profile, "cpuprofile", "", "write a CPU profile of this process (the kvroute side and the driver) to the file")
	fs.StringVar(&o.memProf, "memprofile", "", "write an allocation profile of this process to the file at the end")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.profile != "" {
		f, err := os.Create(o.profile)
		if err != nil {
			return fmt.Errorf("peers: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("peers: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if o.memProf != "" {
		defer func() {
			if f, err := os.Create(o.memProf); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
	if o.pairs < 1 || o.replayPairs < 1 || o.replayPasses < 1 || o.scale <= 0 || o.capacity < 1 {
		return fmt.Errorf("peers: -pairs, -replay-pairs, -replay-passes and -capacity must be at least 1 and -scale positive")
	}
	if o.clock != clockWall && o.clock != clockCPU {
		return fmt.Errorf("peers: -clock must be %s or %s, not %q", clockWall, clockCPU, o.clock)
	}
	if o.clock == clockCPU && processCPU() == 0 {
		return fmt.Errorf("peers: -clock %s: this system's process CPU time is not available", clockCPU)
	}
	names, err := selectWorkloads(o.workloads)
	if err != nil {
		return err
	}
	began := time.Now()

	if o.dir == "" {
		if o.dir, err = os.MkdirTemp("", "kvroute-peers-"); err != nil {
			return fmt.Errorf("peers: %w", err)
		}
		if !o.keep {
			defer os.RemoveAll(o.dir)
		}
	} else if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return fmt.Errorf("peers: %w", err)
	}
	if o.rustBin == "" {
		fmt.Fprintln(stderr, "building the Dynamo side (cargo build --release; the first build takes minutes)")
		t := time.Now()
		if o.rustBin, err = buildRust(ctx, filepath.Join(root, "bench/peers/dynamo/rust"), o.targetDir); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "built %s in %v\n", o.rustBin, time.Since(t).Round(time.Second))
	}

	var rows []row
	var checks []check
	for _, name := range names {
		file := filepath.Join(o.dir, name+".bin")
		t := time.Now()
		if err := generate(name, file, o); err != nil {
			return err
		}
		w, err := readWorkload(file)
		if err != nil {
			return err
		}
		if st, err := os.Stat(file); err == nil {
			fmt.Fprintf(stderr, "%s: generated %s (%.1f MB) in %v\n", name, file, float64(st.Size())/1e6, time.Since(t).Round(time.Millisecond))
		}
		r, c, err := compare(ctx, name, file, w, o, stderr)
		if err != nil {
			return err
		}
		rows, checks = append(rows, r...), append(checks, c...)
		debug.FreeOSMemory()
	}

	writeReport(stdout, rows, checks, o, time.Since(began))
	for _, c := range checks {
		if c.Mismatches[kvSide] > 0 {
			return fmt.Errorf("%w (%s/%s: %d of %d)", errMismatch, c.Workload, c.Section, c.Mismatches[kvSide], c.Answers)
		}
	}
	return nil
}

func selectWorkloads(list string) ([]string, error) {
	var out []string
	known := append(slices.Clone(allWorkloads), extraWorkloads...)
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !slices.Contains(known, n) {
			return nil, fmt.Errorf("peers: unknown workload %q (have %s)", n, strings.Join(known, ", "))
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("peers: no workload selected")
	}
	return out, nil
}

// generate writes workload name to file.
func generate(name, file string, o options) error {
	var w *workload
	switch name {
	case "tree":
		w = genTree(defaultTree().scaled(o.scale))
	case "trace-lru", "trace-random", "trace-lru-warm", "trace-random-warm":
		records, err := bench.ReadMooncakeFile(o.trace)
		if err != nil {
			return err
		}
		e := evictLRU
		if strings.HasPrefix(name, "trace-random") {
			e = evictRandom
		}
		c := defaultTrace(e)
		c.Capacity = o.capacity
		if strings.HasSuffix(name, "-warm") {
			c.Warm = warmShare
		}
		if w, err = genTrace(records, c); err != nil {
			return err
		}
	case "hash":
		c := defaultHash()
		c.Repeat = max(1, int(float64(c.Repeat)*o.scale))
		w = genHash(c)
	}
	return writeWorkload(file, w)
}

// Sides, as indexes of per-side arrays.
const (
	kvSide = iota
	dynSide
	numSides
)

var sideNames = [numSides]string{"kvroute", "Dynamo"}

// row is the timing of one timed section over all pairs.
type row struct {
	Workload, Section string
	Metric            metric
	Times             [numSides][]float64 // ns per unit, one per pair
}

// check is the correctness of one section.
type check struct {
	Workload, Section string
	Answers           int
	Mismatches        [numSides]int
	Errors            [numSides]int64
	RejectedBlocks    [numSides]int64 // blocks of the Stored events among Errors
	FirstErr          string          // kvroute's first Apply error
}

// pairsFor returns the number of pairs to run of workload name: more for
// a trace replay, whose short passes a collection or a burst of page
// faults can slow by half, so that its median holds still.
func (o *options) pairsFor(name string) int {
	if isReplay(name) {
		return o.replayPairs
	}
	return o.pairs
}

// passesFor returns the number of passes of workload name in each run of
// a side: several for a trace replay, one pass of a few milliseconds from
// an empty index, so that a run's time does not hang on where a
// collection or the page faults of fresh memory fall; one for the rest,
// whose sections repeat their queries themselves.
func (o *options) passesFor(name string) int {
	if isReplay(name) {
		return o.replayPasses
	}
	return 1
}

// workerBlocksFor returns the indexer.Config.WorkerBlocks of kvroute's
// index for workload name: the replays' cache capacity with -reserve, else
// zero.
func (o *options) workerBlocksFor(name string) int {
	if isReplay(name) && o.reserve {
		return o.capacity
	}
	return 0
}

// isReplay reports whether workload name is one of the trace replays.
func isReplay(name string) bool { return strings.HasPrefix(name, "trace-") }

// compare runs the pairs of one workload.
func compare(ctx context.Context, name, file string, w *workload, o options, stderr io.Writer) ([]row, []check, error) {
	want := expectedDigests(w)
	rows := make([]row, 0, len(w.Sections))
	checks := make([]check, len(w.Sections))
	rowOf := make([]int, len(w.Sections))
	for i := range w.Sections {
		s := &w.Sections[i]
		checks[i] = check{Workload: name, Section: s.Name, Answers: len(want[i])}
		rowOf[i] = -1
		if s.Timed {
			rowOf[i] = len(rows)
			rows = append(rows, row{Workload: name, Section: s.Name, Metric: s.Metric})
		}
	}
	pairs := o.pairsFor(name)
	for p := range pairs {
		for k := range numSides {
			side := (k + p) % numSides // alternate which side goes first
			var res *sideResult
			var err error
			t := time.Now()
			if side == kvSide {
				res, err = runKV(w, o.procs, o.passesFor(name), o.workerBlocksFor(name))
				runtime.GC()
			} else {
				res, err = runRust(ctx, o.rustBin, file, o.passesFor(name))
			}
			if err != nil {
				return nil, nil, err
			}
			if len(res.Sections) != len(w.Sections) {
				return nil, nil, fmt.Errorf("peers: %s returned %d sections for %d", sideNames[side], len(res.Sections), len(w.Sections))
			}
			if o.clock == clockCPU {
				if err := useCPUTime(res); err != nil {
					return nil, nil, err
				}
			}
			for i := range w.Sections {
				r, c := &res.Sections[i], &checks[i]
				if err := checkSamples(r); err != nil {
					return nil, nil, fmt.Errorf("peers: %s, %s/%s: %w", sideNames[side], name, r.Name, err)
				}
				n := mismatches(want[i], r.Digests)
				if n > 0 && side == kvSide && c.Mismatches[kvSide] == 0 {
					reportMismatch(stderr, name, &w.Sections[i], want[i], r.Digests)
				}
				c.Mismatches[side] = max(c.Mismatches[side], n)
				c.Errors[side] = max(c.Errors[side], r.Errors)
				c.RejectedBlocks[side] = max(c.RejectedBlocks[side], r.RejectedStoredBlocks)
				if side == kvSide && c.FirstErr == "" {
					c.FirstErr = r.FirstErr
				}
				if j := rowOf[i]; j >= 0 {
					rows[j].Times[side] = append(rows[j].Times[side], r.per(w.Sections[i].Metric))
				}
			}
			var detail []string
			for i := range w.Sections {
				if s := &w.Sections[i]; s.Timed {
					detail = append(detail, s.Name+" "+duration(res.Sections[i].per(s.Metric)))
				}
			}
			fmt.Fprintf(stderr, "%s: pair %d/%d: %s done in %v (%s)\n", name, p+1, pairs, sideNames[side],
				time.Since(t).Round(time.Millisecond), strings.Join(detail, ", "))
		}
	}
	return rows, checks, nil
}

// mismatches counts the answers that differ from the expected ones; a
// missing answer counts as a mismatch.
func mismatches(want, got []uint64) int {
	n := max(len(want)-len(got), 0)
	for i := range min(len(want), len(got)) {
		if want[i] != got[i] {
			n++
		}
	}
	return n
}

// checkSamples checks that the full scores a side printed for its first
// queries have the digests it reported for them, so that the digests stand
// for the answers.
func checkSamples(r *sectionResult) error {
	for k, smp := range r.Samples {
		scores := make([]score, len(smp))
		for j, x := range smp {
			scores[j] = score{Worker: x[0], Blocks: uint32(x[1])}
		}
		if k >= len(r.Digests) || scoresDigest(scores) != r.Digests[k] {
			return fmt.Errorf("the digest of answer %d does not match its scores %v", k, smp)
		}
	}
	return nil
}

// reportMismatch prints kvroute's first wrong answer in a section.
func reportMismatch(w io.Writer, name string, s *section, want, got []uint64) {
	slot := 0
	for i := range s.Ops {
		o := &s.Ops[i]
		if !o.answers() {
			continue
		}
		if slot >= len(got) || got[slot] != want[slot] {
			fmt.Fprintf(w, "!!! kvroute MISMATCH in %s/%s: answer %d (operation %d) differs from the ground truth; expected overlaps %v\n",
				name, s.Name, slot, i, o.Want)
			return
		}
		slot++
	}
}
