package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/examples/gateway/gateway"
)

// collector exposes the gateway's counters (the router's come from
// routerprom).
type collector struct {
	gw                        *gateway.Gateway
	requests, retries, failed *prometheus.Desc
}

func newCollector(gw *gateway.Gateway) *collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("kvroute", "gateway", name), help, nil, nil)
	}
	return &collector{gw: gw,
		requests: d("requests_total", "Completion requests received."),
		retries:  d("retries_total", "Attempts on another engine after a request's first."),
		failed:   d("failed_total", "Requests answered with an error after every attempt failed, or refused."),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.requests
	ch <- c.retries
	ch <- c.failed
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.gw.Stats()
	ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(s.Requests))
	ch <- prometheus.MustNewConstMetric(c.retries, prometheus.CounterValue, float64(s.Retries))
	ch <- prometheus.MustNewConstMetric(c.failed, prometheus.CounterValue, float64(s.Failed))
}
