package main

import (
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
)

// sectionResult is one side's measurement of one section. The JSON names
// are those the Rust side prints.
type sectionResult struct {
	Name     string `json:"name"`
	Timed    bool   `json:"timed"`
	Ops      int64  `json:"ops"`
	BlockOps int64  `json:"block_ops"`
	NS       int64  `json:"ns"`
	CPUNS    int64  `json:"cpu_ns"` // the process's CPU time over the section, all threads
	Errors   int64  `json:"errors"`
	// RejectedStoredBlocks is the number of blocks in the Stored events
	// among Errors: work the side skipped.
	RejectedStoredBlocks int64         `json:"rejected_stored_blocks"`
	Samples              [][][2]uint64 `json:"samples"`
	FirstErr             string        `json:"-"`
	Digests              []uint64      `json:"-"`
}

// sideResult is one run of one side over one workload file.
type sideResult struct {
	Side     string          `json:"side"`
	Sections []sectionResult `json:"sections"`
}

// per returns the section's time per unit of m, in nanoseconds.
func (r *sectionResult) per(m metric) float64 {
	n := r.Ops
	if m == perBlockOp {
		n = r.BlockOps
	}
	if n == 0 {
		return 0
	}
	return float64(r.NS) / float64(n)
}

// kvOp is a workload operation in the form kvroute's API takes, built
// before the clock starts.
type kvOp struct {
	kind   opKind
	ev     kvroute.Event
	seqs   []kvroute.SeqHash
	tokens []uint32
	slot   int
}

// prepareKV converts a section's operations for kvroute.
func prepareKV(s *section) []kvOp {
	out := make([]kvOp, len(s.Ops))
	slot := 0
	for i := range s.Ops {
		o, k := &s.Ops[i], &out[i]
		k.kind = o.Kind
		switch o.Kind {
		case opStored:
			k.ev = kvroute.Event{
				Kind: kvroute.EventStored, Worker: kvroute.WorkerKey{ID: kvroute.WorkerID(o.Worker)},
				ID: o.EventID, HasParent: o.HasParent, Parent: o.Parent,
				Blocks: make([]kvroute.StoredBlock, len(o.Blocks)),
			}
			for j, b := range o.Blocks {
				k.ev.Blocks[j] = kvroute.StoredBlock{External: b.Ext, Hash: b.Local}
			}
		case opRemoved:
			k.ev = kvroute.Event{
				Kind: kvroute.EventRemoved, Worker: kvroute.WorkerKey{ID: kvroute.WorkerID(o.Worker)},
				ID: o.EventID, Removed: o.Removed,
			}
		case opQuery:
			k.seqs, k.slot = o.Seqs, slot
			slot++
		case opHash:
			k.tokens, k.slot = o.Tokens, slot
			slot++
		}
	}
	return out
}

// matchDigest is scoresDigest of a MatchResult.
func matchDigest(res *indexer.MatchResult) uint64 {
	var d uint64
	for _, m := range res.Workers {
		if m.Blocks > 0 {
			d += scoreTerm(uint64(m.Worker.ID), uint32(m.Blocks))
		}
	}
	return d
}

// matchScores returns a MatchResult's overlaps sorted by worker.
func matchScores(res *indexer.MatchResult) [][2]uint64 {
	var out [][2]uint64
	for _, m := range res.Workers {
		if m.Blocks > 0 {
			out = append(out, [2]uint64{uint64(m.Worker.ID), uint64(m.Blocks)})
		}
	}
	slices.SortFunc(out, func(a, b [2]uint64) int { return int(a[0]) - int(b[0]) })
	return out
}

// samples is how many queries per section keep their full scores.
const samples = 3

// runKV runs w on a new kvroute index on the calling goroutine, with procs
// as GOMAXPROCS while it runs (0 leaves it alone), passes times, each pass
// on a new index with room for workerBlocks blocks per worker
// (indexer.Config.WorkerBlocks): a section's timings are the sums over
// the passes, its errors those of the first, and every pass must answer
// as the first did.
// The events are converted before the first pass and a collection runs
// before every section, outside the clock.
func runKV(w *workload, procs, passes, workerBlocks int) (*sideResult, error) {
	h, err := kvroute.NewHasher(kvroute.HasherConfig{BlockSize: w.BlockSize})
	if err != nil {
		return nil, fmt.Errorf("peers: %w", err)
	}
	if procs > 0 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	}
	passes = max(passes, 1)
	out := &sideResult{Side: "kvroute", Sections: make([]sectionResult, len(w.Sections))}
	prepared := make([][]kvOp, len(w.Sections))
	for i := range w.Sections {
		s, r := &w.Sections[i], &out.Sections[i]
		prepared[i] = prepareKV(s)
		*r = sectionResult{Name: s.Name, Timed: s.Timed}
		for j := range s.Ops {
			if s.Ops[j].answers() {
				r.Digests = append(r.Digests, 0)
			}
			r.BlockOps += int64(s.Ops[j].blockOps())
		}
		r.Ops = int64(len(prepared[i]) * s.passes() * passes)
		r.BlockOps *= int64(s.passes() * passes)
	}
	var res indexer.MatchResult
	var dst []kvroute.SeqHash
	var again []uint64 // a later pass's digests
	for pass := range passes {
		ix, err := indexer.New(indexer.Config{Hasher: h, WorkerBlocks: workerBlocks})
		if err != nil {
			return nil, fmt.Errorf("peers: %w", err)
		}
		for i := range w.Sections {
			s, r, ops := &w.Sections[i], &out.Sections[i], prepared[i]
			digests := r.Digests
			if pass > 0 {
				again = append(again[:0], r.Digests...)
				digests = again
			}
			runtime.GC()

			cpu0 := processCPU()
			start := time.Now()
			for sp := range s.passes() {
				for j := range ops {
					k := &ops[j]
					switch k.kind {
					case opStored, opRemoved:
						if err := ix.Apply(&k.ev); err != nil && pass == 0 {
							if r.Errors == 0 {
								r.FirstErr = err.Error()
							}
							r.Errors++
							if k.kind == opStored {
								r.RejectedStoredBlocks += int64(len(k.ev.Blocks))
							}
						}
					case opQuery:
						ix.Match(k.seqs, &res)
						digests[k.slot] = matchDigest(&res)
						if pass == 0 && sp == 0 && k.slot < samples {
							r.Samples = append(r.Samples, matchScores(&res))
						}
					case opHash:
						dst = h.AppendSeqHashes(dst[:0], k.tokens)
						digests[k.slot] = seqDigest(dst)
					}
				}
			}
			r.NS += time.Since(start).Nanoseconds()
			if cpu0 > 0 {
				r.CPUNS += processCPU() - cpu0
			}
			if pass > 0 && !slices.Equal(again, r.Digests) {
				return nil, fmt.Errorf("peers: kvroute: section %s: pass %d answered differently from the first", s.Name, pass+1)
			}
		}
		runtime.KeepAlive(ix)
	}
	return out, nil
}
