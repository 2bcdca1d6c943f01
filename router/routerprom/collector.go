// Package routerprom exports a router's statistics as Prometheus metrics.
//
// It lives in its own package so that the router itself does not depend on
// the Prometheus client.
//
// # Usage
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(routerprom.New(r, "kvroute"))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// A process that runs several routers (one per model, say) registers each
// with its own constant labels, so that their series do not collide:
//
//	reg.MustRegister(routerprom.NewWithLabels(chat, "kvroute", prometheus.Labels{"model": "chat"}))
//	reg.MustRegister(routerprom.NewWithLabels(code, "kvroute", prometheus.Labels{"model": "code"}))
//
// Per-worker series exist only while the router knows the worker: a removed
// worker's series are gone from the next scrape.
package routerprom

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/router"
)

// Collector is a prometheus.Collector that reads a Router's Stats on every
// scrape. It keeps no state of its own and is safe for concurrent use.
type Collector struct {
	r *router.Router

	decisions, rejected, disaggregated, outcomes, failures *prometheus.Desc
	promptTokens, predictedCached, actualCached            *prometheus.Desc
	predictedHitRate, actualHitRate, accuracy, syncSeconds *prometheus.Desc
	accuracySamples                                        *prometheus.Desc
	queueDepth, tracked                                    *prometheus.Desc
	workerRequests, workerPrefill, workerBlocks            *prometheus.Desc
	workerHealth, workerDecisions                          *prometheus.Desc
	latency                                                *prometheus.Desc
}

// New returns a Collector for r whose metric names start with namespace
// (for example "kvroute"). It is NewWithLabels with no constant labels.
func New(r *router.Router, namespace string) *Collector {
	return NewWithLabels(r, namespace, nil)
}

// NewWithLabels returns a Collector for r whose metric names start with
// namespace and whose every series carries the constant labels, for
// registering several routers on one registry: collectors whose names and
// constant label values are equal conflict (registration fails), and all
// collectors of one namespace on a registry must use the same label names.
// The labels must not be named worker, rank or role (the per-worker labels);
// registering such a collector fails.
func NewWithLabels(r *router.Router, namespace string, labels prometheus.Labels) *Collector {
	d := func(name, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "router", name), help, variable, labels)
	}
	return &Collector{
		r:                r,
		decisions:        d("decisions_total", "Successful routing decisions."),
		rejected:         d("rejected_total", "Select calls that failed (no worker, all busy, queue full, cancelled)."),
		disaggregated:    d("disaggregated_total", "Decisions that chose a prefill and a decode worker."),
		outcomes:         d("outcomes_total", "Requests ended with Done."),
		failures:         d("failures_total", "Requests that ended with an error other than a cancellation."),
		promptTokens:     d("prompt_tokens_total", "Prompt tokens of all decisions."),
		predictedCached:  d("predicted_cached_tokens_total", "Cached prompt tokens the index predicted."),
		actualCached:     d("actual_cached_tokens_total", "Cached prompt tokens the engines reported."),
		predictedHitRate: d("predicted_hit_rate", "Predicted cached tokens over prompt tokens, since the router started (rate the counters for a window)."),
		actualHitRate:    d("actual_hit_rate", "Reported cached tokens over the prompt tokens of requests that reported them, since the router started."),
		accuracy:         d("routing_accuracy", "Share of recent decisions whose engine found at least 80% of the predicted overlap (1 while routing_accuracy_samples is 0)."),
		accuracySamples:  d("routing_accuracy_samples", "Recent outcomes with a predicted overlap and reported cached tokens that routing_accuracy is computed over."),
		syncSeconds:      d("recommended_sync_interval_seconds", "Index sync interval recommended from the routing accuracy."),
		queueDepth:       d("queue_depth", "Requests waiting in the admission queue."),
		tracked:          d("tracked_requests", "Requests the load tracker holds."),
		workerRequests:   d("worker_active_requests", "Active requests the router tracks per cache domain.", "worker", "rank", "role"),
		workerPrefill:    d("worker_active_prefill_tokens", "Prefill tokens still to compute per cache domain.", "worker", "rank", "role"),
		workerBlocks:     d("worker_active_blocks", "Active KV blocks per cache domain.", "worker", "rank", "role"),
		workerHealth:     d("worker_health", "Health per cache domain: 0 healthy, 1 degraded, 2 unhealthy.", "worker", "rank", "role"),
		workerDecisions:  d("worker_decisions_total", "Decisions per cache domain.", "worker", "rank", "role"),
		latency:          d("select_duration_seconds", "Duration of Select calls."),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.decisions, c.rejected, c.disaggregated, c.outcomes, c.failures,
		c.promptTokens, c.predictedCached, c.actualCached, c.predictedHitRate, c.actualHitRate, c.accuracy,
		c.accuracySamples, c.syncSeconds, c.queueDepth, c.tracked, c.workerRequests, c.workerPrefill, c.workerBlocks,
		c.workerHealth, c.workerDecisions, c.latency} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.r.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter(c.decisions, st.Decisions)
	counter(c.rejected, st.Rejected)
	counter(c.disaggregated, st.Disaggregated)
	counter(c.outcomes, st.Outcomes)
	counter(c.failures, st.Failures)
	counter(c.promptTokens, st.PromptTokens)
	counter(c.predictedCached, st.PredictedCachedTokens)
	counter(c.actualCached, st.ActualCachedTokens)
	gauge(c.predictedHitRate, st.PredictedHitRate)
	gauge(c.actualHitRate, st.ActualHitRate)
	gauge(c.accuracy, st.Accuracy)
	gauge(c.accuracySamples, float64(st.AccuracySamples))
	gauge(c.syncSeconds, st.RecommendedSyncInterval.Seconds())
	gauge(c.queueDepth, float64(st.QueueDepth))
	gauge(c.tracked, float64(st.TrackedRequests))
	for _, w := range st.Workers {
		labels := []string{strconv.FormatUint(uint64(w.Worker.ID), 10), strconv.FormatUint(uint64(w.Worker.Rank), 10), w.Role.String()}
		gauge(c.workerRequests, float64(w.Tracked.ActiveRequests), labels...)
		gauge(c.workerPrefill, float64(w.Tracked.ActivePrefillTokens), labels...)
		gauge(c.workerBlocks, float64(w.Tracked.ActiveBlocks), labels...)
		gauge(c.workerHealth, float64(w.Health), labels...)
		counter(c.workerDecisions, w.Decisions, labels...)
	}
	buckets := make(map[float64]uint64, len(st.SelectLatency.Bounds))
	var cum uint64
	for i, b := range st.SelectLatency.Bounds {
		cum += st.SelectLatency.Counts[i]
		buckets[b.Seconds()] = cum
	}
	ch <- prometheus.MustNewConstHistogram(c.latency, st.SelectLatency.Count, st.SelectLatency.Sum.Seconds(), buckets)
}
