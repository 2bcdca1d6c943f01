package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// hitShare is the share of a prompt the engine must report cached for a
// request to count as a cache hit in Arrivals.
const hitShare = 0.8

// loadBuckets is the number of in-flight buckets of Arrivals: 0, 1, 2,
// and 3 or more requests.
const loadBuckets = 4

// Arrivals breaks a run's requests down by what they met on the worker
// that served them: the requests already in flight there when they were
// sent, and whether the engine reported at least hitShare of the prompt
// cached. It says where the TTFT goes: on NVIDIA Dynamo's mocker a request
// that arrives at a busy worker waits for the decode step under way.
type Arrivals struct {
	// TTFT holds the first-token times of the requests that met i requests
	// in flight (the last bucket: loadBuckets-1 or more), misses in [i][0]
	// and hits in [i][1].
	TTFT [loadBuckets][2][]time.Duration
	// Misses says where the misses went.
	Misses MissKinds
}

// MissKinds classifies the requests that were not cache hits, by their
// shared system prompt (Request.Prefix).
type MissKinds struct {
	First   int // the first request of its prompt in the run
	Evicted int // sent to a worker that had served the prompt before
	Idle    int // sent to an idle worker that had not served it
	Busy    int // sent to a busy worker that had not served it
}

// arrivals computes the run's Arrivals. Requests that failed or carry no
// Request are left out.
func (run *Run) arrivals() Arrivals {
	var a Arrivals
	rs := make([]*Result, 0, len(run.Results))
	for i := range run.Results {
		if r := &run.Results[i]; r.Err == nil && r.Req != nil {
			rs = append(rs, r)
		}
	}
	served := map[int]map[uint64]bool{} // prompt → workers that served it
	inFlight := map[uint64]int{}
	for _, c := range timeline(rs) {
		inFlight[c.r.Worker] += c.delta
		if c.delta < 0 {
			continue
		}
		r := c.r
		before := inFlight[r.Worker] - 1 // the requests already there
		hit := r.PromptTokens > 0 && float64(r.CachedTokens) >= hitShare*float64(r.PromptTokens)
		h := 0
		if hit {
			h = 1
		}
		b := min(before, loadBuckets-1)
		a.TTFT[b][h] = append(a.TTFT[b][h], r.TTFT)
		p := r.Req.Prefix
		switch {
		case hit:
		case len(served[p]) == 0:
			a.Misses.First++
		case served[p][r.Worker]:
			a.Misses.Evicted++
		case before == 0:
			a.Misses.Idle++
		default:
			a.Misses.Busy++
		}
		if served[p] == nil {
			served[p] = map[uint64]bool{}
		}
		served[p][r.Worker] = true
	}
	return a
}

// add merges o into a (the runs of one scenario and arm).
func (a *Arrivals) add(o Arrivals) {
	for i := range a.TTFT {
		for h := range a.TTFT[i] {
			a.TTFT[i][h] = append(a.TTFT[i][h], o.TTFT[i][h]...)
		}
	}
	a.Misses.First += o.Misses.First
	a.Misses.Evicted += o.Misses.Evicted
	a.Misses.Idle += o.Misses.Idle
	a.Misses.Busy += o.Misses.Busy
}

// cell formats one bucket: its requests and their median TTFT.
func cell(ttft []time.Duration) string {
	if len(ttft) == 0 {
		return "–"
	}
	s := slices.Sorted(slices.Values(ttft))
	return fmt.Sprintf("%d, p50 %.1f ms", len(s), ms(percentile(s, 0.5)))
}

// arrivalRows returns the Markdown rows of a, for the table of
// arrivalHeader.
func arrivalRows(scenario, arm string, a Arrivals) []string {
	var rows []string
	for i := range a.TTFT {
		load := fmt.Sprint(i)
		if i == loadBuckets-1 {
			load += " or more"
		}
		rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s | %s |", scenario, arm, load, cell(a.TTFT[i][1]), cell(a.TTFT[i][0])))
	}
	m := a.Misses
	rows = append(rows, fmt.Sprintf("| %s | %s | misses | first of their prompt %d, on a worker that had served it %d | on a non-holder: idle %d, busy %d |",
		scenario, arm, m.First, m.Evicted, m.Idle, m.Busy))
	return rows
}

// arrivalHeader heads the table of arrivalRows.
var arrivalHeader = strings.Join([]string{
	"| scenario | arm | requests in flight on the worker | hits (≥ 80% cached) | misses |",
	"|---|---|---|---|---|",
}, "\n")
