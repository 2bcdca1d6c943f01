package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/epp"
)

// collector exposes the picker's counters (the router's come from
// routerprom).
type collector struct {
	picker *epp.Server
	descs  map[string]*prometheus.Desc
}

var counterNames = []struct{ name, help string }{
	{"requests_total", "Requests (ext_proc streams) seen."},
	{"routed_total", "Requests given endpoints."},
	{"bad_requests_total", "Requests answered 400 or 413."},
	{"unavailable_total", "Requests answered 503: no eligible endpoint."},
	{"shed_total", "Requests answered 429: every endpoint busy."},
	{"tokenize_errors_total", "Requests routed by load alone because their prompt could not be tokenized."},
	{"served_elsewhere_total", "Requests served on a fallback endpoint."},
	{"completed_total", "Responses that reached their end."},
	{"engine_errors_total", "Responses with status 429 or 5xx."},
	{"canceled_total", "Requests that ended before their response."},
	{"predicted_cached_tokens_total", "Cached prompt tokens the index predicted on the serving engine (requests whose engine reported its cached tokens)."},
	{"actual_cached_tokens_total", "Cached prompt tokens the engines reported."},
	{"predicted_cached_blocks_total", "Cached blocks the index predicted on the serving engine."},
	{"actual_cached_blocks_total", "Cached full blocks the engines reported."},
	{"prompt_tokens_total", "Prompt tokens of the requests whose engine reported its cached tokens."},
	{"panics_total", "Requests ended by a panic while routing them (answered with an internal error)."},
}

func newCollector(p *epp.Server) *collector {
	c := &collector{picker: p, descs: map[string]*prometheus.Desc{}}
	for _, n := range counterNames {
		c.descs[n.name] = prometheus.NewDesc("kvroute_epp_"+n.name, n.help, nil, nil)
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.picker.Stats()
	values := map[string]uint64{
		"requests_total": s.Streams, "routed_total": s.Routed, "bad_requests_total": s.BadRequests,
		"unavailable_total": s.Unavailable, "shed_total": s.Shed, "tokenize_errors_total": s.TokenizeErrors,
		"served_elsewhere_total": s.ServedElsewhere, "completed_total": s.Completed,
		"engine_errors_total": s.EngineErrors, "canceled_total": s.Canceled,
		"predicted_cached_tokens_total": s.PredictedCachedTokens, "actual_cached_tokens_total": s.ActualCachedTokens,
		"predicted_cached_blocks_total": s.PredictedCachedBlocks, "actual_cached_blocks_total": s.ActualCachedBlocks,
		"prompt_tokens_total": s.PromptTokens, "panics_total": s.Panics,
	}
	for name, v := range values {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, float64(v))
	}
}
