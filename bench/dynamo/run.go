package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/quickack"
)

// Chooser picks the worker of a request in arms where kvroute routes:
// Before returns the headers to send (the direct-mode worker choice) and
// the hooks to call when the first token arrives and with the result.
type Chooser interface {
	Before(ctx context.Context, r *Request) (http.Header, Hooks, error)
}

// Hooks are called as a routed request progresses; nil ones are skipped.
type Hooks struct {
	FirstToken func()
	Done       func(*Result)
	// Tokens, when not nil, are the prompt's token ids, sent in
	// nvext.token_data.
	Tokens []uint32
}

// Run is one run of a scenario through one arm.
type Run struct {
	Arm, Scenario string
	Rep           int
	Results       []Result
	Wall          time.Duration
	Began         time.Time
}

// drive sends the scenario's requests to url: Concurrency conversations at
// a time, the turns of each in order. With quickAck the client's
// connections acknowledge at once (internal/quickack): Dynamo's frontend
// leaves Nagle's algorithm on, so on a kept-alive connection whose
// acknowledgements Linux delays, a first token faster than about 40 ms
// would reach the client about 40 ms after the request whatever the
// routing.
func drive(ctx context.Context, url string, s *Scenario, ch Chooser, quickAck bool) (*Run, error) {
	convs := map[int][]*Request{}
	var order []int
	for i := range s.Requests {
		r := &s.Requests[i]
		if _, ok := convs[r.Conv]; !ok {
			order = append(order, r.Conv)
		}
		convs[r.Conv] = append(convs[r.Conv], r)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: s.Concurrency * 2}
	if quickAck {
		tr.DialContext = quickack.DialContext(&net.Dialer{Timeout: 30 * time.Second})
	}
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Minute}
	next := make(chan []*Request)
	out := make(chan Result, len(s.Requests))
	var wg sync.WaitGroup
	start := time.Now()
	for range s.Concurrency {
		wg.Go(func() {
			for turns := range next {
				for _, r := range turns {
					var hdr http.Header
					var hooks Hooks
					if ch != nil {
						var err error
						if hdr, hooks, err = ch.Before(ctx, r); err != nil {
							out <- Result{Req: r, Err: err, Predicted: -1}
							continue
						}
					}
					res := send(ctx, hc, url, modelName, r, hdr, hooks)
					if hooks.Done != nil {
						hooks.Done(&res)
					}
					out <- res
				}
			}
		})
	}
	go func() {
		defer close(next)
		for _, c := range order {
			select {
			case next <- convs[c]:
			case <-ctx.Done():
				return
			}
		}
	}()
	wg.Wait()
	wall := time.Since(start)
	close(out)
	run := &Run{Scenario: s.Name, Wall: wall, Began: start}
	var errs int
	var first error
	for r := range out {
		if r.Err != nil {
			errs++
			if first == nil {
				first = r.Err
			}
		}
		run.Results = append(run.Results, r)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if errs > 0 {
		return run, fmt.Errorf("%d of %d requests failed, first: %w", errs, len(run.Results), first)
	}
	return run, nil
}

// Summary is what a run measured.
type Summary struct {
	TTFTp50, TTFTp99 time.Duration
	Throughput       float64 // requests per second
	CachedFraction   float64 // cached prompt tokens / prompt tokens
	PerWorker        []int   // requests per worker, most first
	// Predicted is the number of requests with a prediction; Exact of
	// them predicted the cached tokens within one block; PredictedTokens
	// and ActualTokens sum the predictions and the engines' reports over
	// them.
	Predicted, Exact              int
	PredictedTokens, ActualTokens int
	// Uneven is the share of the time with requests in flight during which
	// one worker had two or more requests more than another (workers
	// without any counting as idle): time-weighted, it says how often the
	// router let a worker run ahead while another had room, which costs
	// the mocker's decode steps throughput.
	Uneven float64
}

// Summarize computes run's summary over a pool of workers (at least the
// number of workers the requests went to); blockSize bounds an exact
// prediction.
func (run *Run) Summarize(workers, blockSize int) Summary {
	var s Summary
	ttft := make([]time.Duration, 0, len(run.Results))
	var prompt, cached int
	perWorker := map[uint64]int{}
	for _, r := range run.Results {
		if r.Err != nil {
			continue
		}
		ttft = append(ttft, r.TTFT)
		prompt += r.PromptTokens
		cached += r.CachedTokens
		perWorker[r.Worker]++
		if r.Predicted >= 0 {
			s.Predicted++
			s.PredictedTokens += r.Predicted
			s.ActualTokens += r.CachedTokens
			if d := r.Predicted - r.CachedTokens; d > -blockSize && d < blockSize {
				s.Exact++
			}
		}
	}
	slices.Sort(ttft)
	s.TTFTp50, s.TTFTp99 = percentile(ttft, 0.50), percentile(ttft, 0.99)
	if run.Wall > 0 {
		s.Throughput = float64(len(ttft)) / run.Wall.Seconds()
	}
	if prompt > 0 {
		s.CachedFraction = float64(cached) / float64(prompt)
	}
	for _, n := range perWorker {
		s.PerWorker = append(s.PerWorker, n)
	}
	slices.SortFunc(s.PerWorker, func(a, b int) int { return b - a })
	s.Uneven = run.uneven(workers)
	return s
}

// change is request r starting (delta 1) or ending (delta −1) on its
// worker.
type change struct {
	at    time.Time
	delta int
	r     *Result
}

// timeline returns the starts and ends of rs in time order. At one
// instant ends come before starts: a request that ends as another starts
// does not overlap it.
func timeline(rs []*Result) []change {
	ch := make([]change, 0, 2*len(rs))
	for _, r := range rs {
		ch = append(ch, change{r.Start, 1, r}, change{r.Start.Add(r.Latency), -1, r})
	}
	slices.SortStableFunc(ch, func(a, b change) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	return ch
}

// uneven returns Summary.Uneven for a pool of the given number of workers.
func (run *Run) uneven(workers int) float64 {
	var rs []*Result
	for i := range run.Results {
		if r := &run.Results[i]; r.Err == nil {
			rs = append(rs, r)
		}
	}
	ch := timeline(rs)
	inFlight := map[uint64]int{}
	var busy, uneven time.Duration
	total := 0
	for i, c := range ch {
		if i > 0 && total > 0 {
			d := c.at.Sub(ch[i-1].at)
			busy += d
			lo, hi := 0, 0
			if len(inFlight) >= workers {
				lo = math.MaxInt
			}
			for _, n := range inFlight {
				lo, hi = min(lo, n), max(hi, n)
			}
			if hi-lo >= 2 {
				uneven += d
			}
		}
		inFlight[c.r.Worker] += c.delta
		total += c.delta
	}
	if busy == 0 {
		return 0
	}
	return float64(uneven) / float64(busy)
}

// percentile returns the p-quantile of sorted by the nearest-rank method.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// WriteJSONL writes one JSON line per request of the run to path.
func (run *Run) WriteJSONL(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, r := range run.Results {
		rec := struct {
			Conv, Turn, Prefix                int
			StartMS, TTFTms, LatencyMS        float64
			Prompt, Cached, Output, Predicted int
			Worker                            uint64
			Err                               string `json:",omitempty"`
		}{Conv: r.Req.Conv, Turn: r.Req.Turn, Prefix: r.Req.Prefix, StartMS: ms(r.Start.Sub(run.Began)), TTFTms: ms(r.TTFT), LatencyMS: ms(r.Latency),
			Prompt: r.PromptTokens, Cached: r.CachedTokens, Output: r.OutputTokens, Predicted: r.Predicted, Worker: r.Worker}
		if r.Err != nil {
			rec.Err = r.Err.Error()
		}
		if err := enc.Encode(rec); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
