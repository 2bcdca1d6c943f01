package enginemetrics_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/internal/fakeengine"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

func TestScraperFeedsHeartbeats(t *testing.T) {
	e, err := fakeengine.Start(fakeengine.Config{ID: 3, BlockSize: 16, Capacity: 500})
	require.NoError(t, err)
	defer e.Close()
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	require.NoError(t, err)
	s, err := enginemetrics.New(enginemetrics.Config{Router: r, Interval: 10 * time.Millisecond})
	require.NoError(t, err)
	target := enginemetrics.Target{Worker: 3, URL: e.URL() + "/metrics"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := s.Verify(ctx, target)
	require.NoError(t, err)
	require.Equal(t, 16, m.BlockSize)
	require.Equal(t, 500, m.GPUBlocks)
	require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: 3, Block: 16}))
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, target) }()
	require.Eventually(t, func() bool {
		for _, w := range r.Stats().Workers {
			if w.Worker.ID == 3 && w.Reported.KVCapacityBlocks == 500 {
				return true
			}
		}
		return false
	}, 5*time.Second, 5*time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

func TestVerifyBlockSizeMismatch(t *testing.T) {
	e, err := fakeengine.Start(fakeengine.Config{ID: 4, BlockSize: 32})
	require.NoError(t, err)
	defer e.Close()
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	require.NoError(t, err)
	s, err := enginemetrics.New(enginemetrics.Config{Router: r})
	require.NoError(t, err)
	_, err = s.Verify(context.Background(), enginemetrics.Target{Worker: 4, URL: e.URL() + "/metrics"})
	require.ErrorIs(t, err, enginemetrics.ErrBlockSize)
	var bse *enginemetrics.BlockSizeError
	require.ErrorAs(t, err, &bse)
	require.Equal(t, enginemetrics.BlockSizeError{Worker: 4, Engine: 32, Router: 16}, *bse)
}

func TestScrapeErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/broken" {
			http.Error(w, "no", http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "up 1")
	}))
	defer srv.Close()
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	s, err := enginemetrics.New(enginemetrics.Config{Router: r})
	require.NoError(t, err)
	_, err = s.Scrape(context.Background(), enginemetrics.Target{URL: srv.URL + "/broken"})
	require.ErrorIs(t, err, enginemetrics.ErrScrape)
	_, err = s.Scrape(context.Background(), enginemetrics.Target{URL: srv.URL + "/metrics"})
	require.ErrorIs(t, err, enginemetrics.ErrMetrics)
	_, err = enginemetrics.New(enginemetrics.Config{})
	require.ErrorIs(t, err, enginemetrics.ErrConfig)
}

// beats is a Reporter that records heartbeats.
type beats struct {
	got map[kvroute.WorkerKey]bool
}

func (b *beats) Heartbeat(w kvroute.WorkerKey, _ scheduling.Load) error {
	b.got[w] = true
	return nil
}

func (b *beats) Hasher() kvroute.Hasher { return kvroute.MustHasher(kvroute.HasherConfig{}) }

// A rank the scrape says nothing of sends no heartbeat: the router's
// heartbeat timeouts judge it, instead of a report of an idle rank.
func TestReportSkipsRanksWithoutSamples(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "vllm:num_requests_running{engine=\"0\"} 3\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.9\nvllm:num_requests_running{engine=\"2\"} 1\n")
	}))
	defer srv.Close()
	rec := &beats{got: map[kvroute.WorkerKey]bool{}}
	s, err := enginemetrics.New(enginemetrics.Config{Router: rec})
	require.NoError(t, err)
	for _, ranks := range []int{0, 4} {
		clear(rec.got)
		tg := enginemetrics.Target{Worker: 1, URL: srv.URL, Ranks: ranks}
		m, err := s.Scrape(context.Background(), tg)
		require.NoError(t, err)
		require.NoError(t, s.Report(tg, &m))
		require.Equal(t, map[kvroute.WorkerKey]bool{{ID: 1}: true, {ID: 1, Rank: 2}: true}, rec.got, "target ranks %d", ranks)
	}
}
