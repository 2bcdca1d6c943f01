package bench

import (
	"context"
	"math"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
	"github.com/stretchr/testify/require"
)

// cachePreferring costs a candidate by the prompt blocks it does not cache,
// so that the best cache holder wins when no bound intervenes.
var cachePreferring = scheduling.CostFuncFunc(func(req *scheduling.Request, cands []scheduling.Candidate, costs []float64) {
	for i := range cands {
		costs[i] = float64(req.Blocks - cands[i].CachedBlocks())
	}
})

func cands(active []int, cached []int) []scheduling.Candidate {
	c := make([]scheduling.Candidate, len(active))
	for i := range c {
		c[i].Worker = kvroute.WorkerKey{ID: kvroute.WorkerID(i + 1)}
		c[i].Load.ActiveRequests = active[i]
		c[i].Cached[kvroute.TierDevice] = cached[i]
	}
	return c
}

func TestSpreadBound(t *testing.T) {
	tests := []struct {
		name   string
		cfg    SpreadBoundConfig
		active []int
		cached []int
		want   int // index of the cheapest candidate
	}{
		{
			// (3, 2, 2, 0) in flight: 1.5 times the mean of 2 lets the
			// holder at 2 take a third while a worker is idle; the spread
			// cap (least 1, plus 1) does not.
			name: "idle worker takes the request over a holder at 2", active: []int{3, 2, 2, 0}, cached: []int{0, 10, 0, 0}, want: 3,
		},
		{
			name: "holder within one of the least takes it", active: []int{2, 2, 2, 1}, cached: []int{0, 10, 0, 0}, want: 1,
		},
		{
			name: "holder over the cap loses to the best within it", active: []int{3, 2, 1, 1}, cached: []int{10, 0, 4, 0}, want: 2,
		},
		{
			name: "holder extra lets a full holder run one further ahead", cfg: SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1},
			active: []int{2, 1, 3, 1}, cached: []int{0, 0, 10, 0}, want: 2,
		},
		{
			name: "holder extra needs the share", cfg: SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1},
			active: []int{3, 2, 1, 1}, cached: []int{7, 0, 0, 1}, want: 3,
		},
		{
			// Mean (40 + 1) / 4 = 10.25: a worker may run ⌈10.25⌉ − 1 = 10
			// ahead of the least loaded (5 with the request): the first
			// holder (15 with the request) is within, the second (16) not.
			name: "many requests per worker: less than the mean ahead", active: []int{14, 15, 4, 7}, cached: []int{10, 10, 0, 0}, want: 0,
		},
		{
			name: "idle first: a full holder at 2 loses to an idle worker", cfg: SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1, IdleFirst: true},
			active: []int{2, 2, 2, 0}, cached: []int{10, 0, 0, 0}, want: 3,
		},
		{
			name: "idle first: a holder one ahead of an idle worker takes it", cfg: SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1, IdleFirst: true},
			active: []int{1, 2, 3, 0}, cached: []int{10, 0, 0, 0}, want: 0,
		},
		{
			name: "idle first: no idle worker, the holder extra applies", cfg: SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1, IdleFirst: true},
			active: []int{3, 2, 1, 1}, cached: []int{10, 0, 0, 0}, want: 0,
		},
		{
			name: "negative counts count as zero", active: []int{-5, 1, 1, 1}, cached: []int{0, 10, 0, 0}, want: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSpreadBound(cachePreferring, tc.cfg)
			require.NoError(t, err)
			c := cands(tc.active, tc.cached)
			costs := make([]float64, len(c))
			s.Costs(&scheduling.Request{Blocks: 10}, c, costs)
			best := 0
			for i := range costs {
				if costs[i] < costs[best] {
					best = i
				}
			}
			require.Equal(t, tc.want, best, "costs %v", costs)
		})
	}
}

func TestSpreadBoundActiveExtra(t *testing.T) {
	s, err := NewSpreadBound(cachePreferring, SpreadBoundConfig{HolderShare: 0.8, HolderExtra: 1, ActiveExtra: 2})
	require.NoError(t, err)
	tests := []struct {
		name     string
		added    []int // blocks the request would add to each worker's active ones
		wantOver []bool
	}{
		// (4, 1, 1, 1) in flight, every worker caching the prompt: the
		// cap is 2 + 1 = 3, holders may take 4, active holders 5.
		{"prefix in flight on the loaded worker", []int{1, 10, 10, 10}, []bool{false, false, false, false}},
		{"prefix only cached on the loaded worker", []int{10, 10, 10, 10}, []bool{true, false, false, false}},
		{"less than the share in flight", []int{3, 10, 10, 10}, []bool{true, false, false, false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := cands([]int{4, 1, 1, 1}, []int{10, 10, 10, 10})
			for i := range c {
				c[i].Load.ActiveDecodeBlocks = 50
				c[i].Load.PotentialDecodeBlocks = 50 + tc.added[i]
			}
			costs := make([]float64, len(c))
			s.Costs(&scheduling.Request{Blocks: 10}, c, costs)
			for i := range costs {
				require.Equal(t, tc.wantOver[i], costs[i] >= spreadOver, "candidate %d: costs %v", i, costs)
			}
		})
	}
}

func TestSpreadBoundKeepsOrderOverTheCap(t *testing.T) {
	s, err := NewSpreadBound(cachePreferring, SpreadBoundConfig{})
	require.NoError(t, err)
	c := cands([]int{4, 5, 0}, []int{8, 10, 0})
	costs := make([]float64, 3)
	s.Costs(&scheduling.Request{Blocks: 10}, c, costs)
	require.Less(t, costs[2], costs[1])
	require.Less(t, costs[1], costs[0], "over the cap, more cache still ranks first")
}

func TestSpreadBoundFewCandidates(t *testing.T) {
	s, err := NewSpreadBound(cachePreferring, SpreadBoundConfig{})
	require.NoError(t, err)
	c := cands([]int{9}, []int{0})
	costs := make([]float64, 1)
	s.Costs(&scheduling.Request{Blocks: 10}, c, costs)
	require.Equal(t, []float64{10}, costs, "one candidate is never over a cap")
	s.Costs(&scheduling.Request{Blocks: 10}, nil, nil)
}

func TestNewSpreadBoundErrors(t *testing.T) {
	tests := []struct {
		name  string
		inner scheduling.CostFunc
		cfg   SpreadBoundConfig
	}{
		{"nil inner", nil, SpreadBoundConfig{}},
		{"negative slack", cachePreferring, SpreadBoundConfig{Slack: -1}},
		{"NaN slack", cachePreferring, SpreadBoundConfig{Slack: math.NaN()}},
		{"infinite slack", cachePreferring, SpreadBoundConfig{Slack: math.Inf(1)}},
		{"negative extra", cachePreferring, SpreadBoundConfig{HolderShare: 0.5, HolderExtra: -1}},
		{"extra without share", cachePreferring, SpreadBoundConfig{HolderExtra: 1}},
		{"share above 1", cachePreferring, SpreadBoundConfig{HolderShare: 1.5, HolderExtra: 1}},
		{"share without extra", cachePreferring, SpreadBoundConfig{HolderShare: 0.5}},
		{"active extra below holder extra", cachePreferring, SpreadBoundConfig{HolderShare: 0.5, HolderExtra: 2, ActiveExtra: 1}},
		{"idle first in KV blocks", cachePreferring, SpreadBoundConfig{IdleFirst: true, Measure: scheduling.MeasureKVBlocks}},
		{"active extra in KV blocks", cachePreferring, SpreadBoundConfig{HolderShare: 0.5, HolderExtra: 1, ActiveExtra: 2, Measure: scheduling.MeasureKVBlocks}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewSpreadBound(tc.inner, tc.cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
		})
	}
}

func TestCandidatePolicies(t *testing.T) {
	sc := reducedScenario(t, 400)
	for _, p := range CandidatePolicies() {
		t.Run(p.Name, func(t *testing.T) {
			got, err := PolicyByName(p.Name)
			require.NoError(t, err)
			require.Equal(t, p.OwnLoad, got.OwnLoad)
			res, err := Run(context.Background(), sc.Config, sc.Workload, p)
			require.NoError(t, err)
			require.Equal(t, 400, res.Requests)
			require.Greater(t, res.HitRate, 0.6, "a cache-aware policy keeps most shared prefixes cached")
		})
	}
}

func TestReportFilters(t *testing.T) {
	in := scheduling.Load{
		ActivePrefillTokens: 100, ActiveDecodeBlocks: 7, PotentialDecodeBlocks: 9, ActiveRequests: 3,
		MaxRequests: 64, QueueDepth: 2, KVUtilization: 0.5, KVCapacityBlocks: 800,
	}
	noPrefill, noRequests := in, in
	noPrefill.ActivePrefillTokens = 0
	noRequests.ActiveRequests, noRequests.QueueDepth = 0, 0
	require.Equal(t, noPrefill, WithoutReportedPrefill(in))
	require.Equal(t, noRequests, WithoutReportedRequests(in))
}

func TestReportFilterApplied(t *testing.T) {
	sc := reducedScenario(t, 200)
	p := KVRoutePolicy()
	var reports int
	p.ReportFilter = func(l scheduling.Load) scheduling.Load {
		reports++
		return WithoutReportedRequests(l)
	}
	res, err := Run(context.Background(), sc.Config, sc.Workload, p)
	require.NoError(t, err)
	require.Equal(t, 200, res.Requests)
	require.Positive(t, reports, "every engine load report passes the filter")
	p.OwnLoad, reports = true, 0
	_, err = Run(context.Background(), sc.Config, sc.Workload, p)
	require.NoError(t, err)
	require.Zero(t, reports, "OwnLoad takes precedence over the filter")
}
