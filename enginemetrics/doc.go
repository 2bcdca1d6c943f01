// Package enginemetrics turns inference engines' Prometheus metrics into
// router load reports: it scrapes vLLM's and SGLang's /metrics, reads their
// queue depth, running requests and KV-cache usage, and reports them with
// router.Router.Heartbeat.
//
// # Usage
//
//  1. Create a Scraper with the router (Config.Router) and, optionally, an
//     HTTP client and interval.
//  2. Before adding an engine to the router, call Scraper.Verify: it
//     scrapes once and returns an error wrapping ErrBlockSize when the
//     engine's KV block size (vLLM's cache_config_info) differs from the
//     router's, which would otherwise match nothing, silently.
//  3. Start Scraper.Run for each engine on a goroutine; it reports a
//     heartbeat per data-parallel rank after every successful scrape, and
//     none after a failed one (the router then marks the engine degraded
//     and unhealthy as its HealthConfig says).
//
// In code:
//
//	s, _ := enginemetrics.New(enginemetrics.Config{Router: r})
//	t := enginemetrics.Target{Worker: 7, URL: "http://10.0.0.7:8000/metrics"}
//	if _, err := s.Verify(ctx, t); err != nil {
//		return err // errors.Is(err, enginemetrics.ErrBlockSize)
//	}
//	_ = r.AddWorker(router.StaticWorker{WorkerID: 7, Block: 16})
//	go s.Run(ctx, t)
//
// # Metrics read
//
// vLLM: vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc (older vllm:gpu_cache_usage_perc), both 0 to 1,
// and vllm:cache_config_info's block_size and num_gpu_blocks labels. SGLang:
// sglang:num_running_reqs, sglang:num_queue_reqs and sglang:token_usage.
// Data-parallel engines label each rank's series: vLLM with "engine",
// SGLang with "dp_rank"; series without such a label are rank 0.
//
// # Limits
//
// Parse refuses texts beyond MaxTextBytes, sample lines with more than
// MaxLabels labels and texts with more than MaxSamples sample lines, with
// an error naming the line. The label bound keeps its time linear in the
// text's size: the Prometheus text parser's work on one line grows with
// the square of its labels.
//
// # Merging with the router's own load
//
// The router tracks the requests it routed itself, and
// router.Config.LoadReports says what it takes from a report. By default
// (router.LoadReportCapacities) it takes the capacities only: num_gpu_blocks
// is the KV capacity, and the load in flight is the router's own count,
// which a scrape of an engine that has just drained lags behind. With
// router.LoadReportMerged, for engines that also serve requests other
// routers or clients send, the engine's running requests count as active
// requests when they exceed the router's own count, its waiting requests
// are the queue depth and its KV-cache usage the utilisation: costs and
// busy thresholds then see the larger of the two views.
package enginemetrics
