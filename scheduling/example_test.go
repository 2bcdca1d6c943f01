package scheduling_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

// Dynamo's documented example: the worker with a middling cache and a light
// decode load wins over the one with the most cached blocks.
func ExampleDynamoCost() {
	cost, _ := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{})
	req := scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16}
	cands := []scheduling.Candidate{
		{Worker: kvroute.WorkerKey{ID: 1}, Cached: [kvroute.NumTiers]int{2}, Load: scheduling.Load{PotentialDecodeBlocks: 10}},
		{Worker: kvroute.WorkerKey{ID: 2}, Cached: [kvroute.NumTiers]int{5}, Load: scheduling.Load{PotentialDecodeBlocks: 5}},
		{Worker: kvroute.WorkerKey{ID: 3}, Cached: [kvroute.NumTiers]int{8}, Load: scheduling.Load{PotentialDecodeBlocks: 9}},
	}
	costs := make([]float64, len(cands))
	cost.Costs(&req, cands, costs)
	fmt.Println(costs)
	// Output: [18 10 11]
}

func ExampleWeightedScore() {
	score, _ := scheduling.NewWeightedScore(scheduling.WeightedScoreConfig{})
	sel, _ := scheduling.NewSelector(scheduling.SelectorConfig{})
	req := scheduling.Request{PromptTokens: 1600, Blocks: 100, BlockSize: 16}
	cands := []scheduling.Candidate{
		{Worker: kvroute.WorkerKey{ID: 1}, Cached: [kvroute.NumTiers]int{87}, Load: scheduling.Load{ActiveRequests: 12, MaxRequests: 16}},
		{Worker: kvroute.WorkerKey{ID: 2}, Cached: [kvroute.NumTiers]int{65}, Load: scheduling.Load{ActiveRequests: 2, MaxRequests: 16}},
	}
	costs := make([]float64, len(cands))
	i, _ := scheduling.Choose(score, sel, &req, cands, costs)
	fmt.Printf("scores %.4f %.4f, chosen worker %s\n", -costs[0], -costs[1], cands[i].Worker)
	// Output: scores 0.2220 0.3400, chosen worker 2/0
}

func ExampleSelector() {
	sel, _ := scheduling.NewSelector(scheduling.SelectorConfig{Seed: 42})
	costs := []float64{3, 1, 1, 7}
	counts := make([]int, len(costs))
	for range 1000 {
		counts[sel.Select(costs, scheduling.OptFloat{})]++
	}
	// Only the two cheapest are chosen, about equally often.
	fmt.Println(counts[0], counts[3], counts[1] > 400, counts[2] > 400)
	// With temperature 1 for one request, every worker may be chosen.
	fmt.Println(sel.Select([]float64{5, 5}, scheduling.Float(1)) >= 0)
	// Output:
	// 0 0 true true
	// true
}

func ExampleStalenessCost() {
	clock := fixedClock(time.Date(2026, 1, 1, 12, 0, 10, 0, time.UTC))
	inner, _ := scheduling.NewDynamoCost(scheduling.DynamoCostConfig{})
	cost, _ := scheduling.NewStalenessCost(inner, scheduling.StalenessConfig{Interval: 2 * time.Second, Clock: clock})
	req := scheduling.Request{PromptTokens: 160, Blocks: 10, BlockSize: 16}
	cands := []scheduling.Candidate{
		// Updated 1 s ago: trusted. Cost 10 − 8 + 9 = 11.
		{Cached: [kvroute.NumTiers]int{8}, Load: scheduling.Load{PotentialDecodeBlocks: 9}, LastUpdate: clock.Now().Add(-time.Second)},
		// Updated 5 s ago: 3 s past the interval, freshness 1 − 3/6 = 0.5.
		{Cached: [kvroute.NumTiers]int{8}, Load: scheduling.Load{PotentialDecodeBlocks: 9}, LastUpdate: clock.Now().Add(-5 * time.Second)},
	}
	costs := make([]float64, len(cands))
	cost.Costs(&req, cands, costs)
	fmt.Println(costs, cands[1].OverlapDiscount)
	// Output: [11 15] 0.5
}

// The default cost sends a prompt to the worker holding its prefix until
// that worker is twice as busy as the mean.
func ExampleNewDefaultCost() {
	cost, _ := scheduling.NewDefaultCost(16)
	sel, _ := scheduling.NewSelector(scheduling.SelectorConfig{})
	req := scheduling.Request{PromptTokens: 1600, Blocks: 100, BlockSize: 16}
	cands := []scheduling.Candidate{
		{Worker: kvroute.WorkerKey{ID: 1}, Cached: [kvroute.NumTiers]int{94}, Load: scheduling.Load{ActiveRequests: 2, PotentialDecodeBlocks: 300}},
		{Worker: kvroute.WorkerKey{ID: 2}, Load: scheduling.Load{ActiveRequests: 2, PotentialDecodeBlocks: 300}},
		{Worker: kvroute.WorkerKey{ID: 3}, Load: scheduling.Load{ActiveRequests: 2, PotentialDecodeBlocks: 300}},
		{Worker: kvroute.WorkerKey{ID: 4}, Load: scheduling.Load{ActiveRequests: 1, PotentialDecodeBlocks: 200}},
	}
	costs := make([]float64, len(cands))
	i, _ := scheduling.Choose(cost, sel, &req, cands, costs)
	fmt.Println("holder within the bound:", cands[i].Worker.ID)
	// A sixth request on the holder while another worker has none is over
	// ⌈2 · (9 + 1) / 4⌉ = 5.
	cands[0].Load.ActiveRequests = 5
	cands[3].Load = scheduling.Load{PotentialDecodeBlocks: 100}
	i, _ = scheduling.Choose(cost, sel, &req, cands, costs)
	fmt.Println("holder over the bound:", cands[i].Worker.ID)
	// Output:
	// holder within the bound: 1
	// holder over the bound: 4
}

type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }

func ExampleTracker() {
	tracker, _ := scheduling.NewTracker(scheduling.TrackerConfig{BlockSize: 16})
	w := kvroute.WorkerKey{ID: 1}
	system := []kvroute.SeqHash{11, 12, 13, 14} // a shared system prompt
	userA := append(system[:4:4], 101, 102)     // two prompts behind it
	userB := append(system[:4:4], 201, 202, 203)

	_ = tracker.Add(1, w, userA, 96)
	fmt.Printf("%+v\n", tracker.Load(w))
	// userB shares 4 blocks with the active request: 3 new blocks.
	fmt.Println(tracker.PotentialDecodeBlocks(w, userB))
	_ = tracker.Add(2, w, userB, 48)
	tracker.PrefillDone(1)
	tracker.AddOutputTokens(1, 20) // two output blocks
	fmt.Printf("%+v\n", tracker.Load(w))
	tracker.Free(1)
	tracker.Free(2)
	fmt.Printf("%+v %v\n", tracker.Load(w), tracker.Free(2))
	// Output:
	// {ActiveRequests:1 ActivePrefillTokens:96 ActiveBlocks:6}
	// 9
	// {ActiveRequests:2 ActivePrefillTokens:48 ActiveBlocks:11}
	// {ActiveRequests:0 ActivePrefillTokens:0 ActiveBlocks:0} false
}

func ExampleBusyThresholds_Filter() {
	busy := scheduling.BusyThresholds{PrefillTokens: 1} // busy above one full batch of prefill
	candidates := func(prefill1, prefill2 int) []scheduling.Candidate {
		return []scheduling.Candidate{
			{Worker: kvroute.WorkerKey{ID: 1}, Load: scheduling.Load{ActivePrefillTokens: prefill1, MaxBatchedTokens: 8192}},
			{Worker: kvroute.WorkerKey{ID: 2}, Load: scheduling.Load{ActivePrefillTokens: prefill2, MaxBatchedTokens: 8192}},
		}
	}
	eligible, err := busy.Filter(candidates(9000, 1000))
	fmt.Println(len(eligible), eligible[0].Worker, err)
	_, err = busy.Filter(candidates(9000, 8200))
	fmt.Println(errors.Is(err, scheduling.ErrAllBusy), err)
	// Output:
	// 1 2/0 <nil>
	// true scheduling: all 2 workers busy
}

func ExampleQueue() {
	q, _ := scheduling.NewQueue(scheduling.QueueConfig{Policy: scheduling.WSPT})
	saturated := true // every worker is over its prefill budget
	admitted := make(chan string)
	for _, r := range []struct {
		name   string
		tokens int
	}{{"long", 8192}, {"short", 256}} {
		go func() {
			if err := q.Wait(context.Background(), scheduling.Item{NewTokens: r.tokens}, saturated); err == nil {
				admitted <- r.name
			}
		}()
		for q.Len() == 0 || (r.name == "short" && q.Len() < 2) {
			time.Sleep(time.Millisecond)
		}
	}
	// Load dropped: admit one request at a time, shortest work first.
	q.Release(1)
	fmt.Println(<-admitted)
	q.Release(1)
	fmt.Println(<-admitted)
	// Output:
	// short
	// long
}
