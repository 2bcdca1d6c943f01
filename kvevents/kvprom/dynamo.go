package kvprom

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/kvevents/dynamo"
)

// DynamoSource is what a DynamoCollector reads on every scrape: a
// *dynamo.Subscriber or *dynamo.NATSSubscriber.
type DynamoSource interface {
	Stats() dynamo.Stats
}

// DynamoCollector is a prometheus.Collector for the counters of Dynamo
// event-plane subscribers (package kvevents/dynamo). Every metric is a
// counter labelled with the subscriber name given to Add. It is safe for
// concurrent use.
type DynamoCollector struct {
	mu      sync.Mutex
	sources map[string]DynamoSource

	descs       []*prometheus.Desc // in the order of dynamoValues
	appliedKind *prometheus.Desc
}

// NewDynamo returns a DynamoCollector whose metric names start with
// namespace (for example "kvroute"), followed by "dynamo_events".
func NewDynamo(namespace string) *DynamoCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "dynamo_events", name), help, append([]string{"subscriber"}, labels...), nil)
	}
	return &DynamoCollector{
		sources: make(map[string]DynamoSource),
		descs: []*prometheus.Desc{
			d("messages_received_total", "Event-plane messages received, of every topic."),
			d("messages_malformed_total", "Messages or payloads that did not decode and were skipped (no reset)."),
			d("messages_skipped_total", "Messages of topics the subscriber does not read."),
			d("gaps_total", "Jumps in a publisher's sequence."),
			d("messages_lost_total", "Messages the sequence gaps skipped over."),
			d("messages_duplicate_total", "Messages whose sequence was already seen."),
			d("publisher_restarts_total", "Publishers that counted from 0 again."),
			d("events_applied_total", "RouterEvents applied to the index without error."),
			d("apply_errors_total", "RouterEvents the index rejected."),
			d("unknown_parents_total", "Stored events rejected for an unknown parent block."),
			d("worker_resets_total", "Worker resets sent to the index."),
			d("load_reports_total", "Heartbeats sent to the router from kv_metrics and forward-pass-metrics."),
			d("load_errors_total", "Heartbeats the router refused."),
			d("connections_total", "Connections (or subscriptions) made to publishers."),
			d("worker_queries_total", "KV queries made to workers' local indexers."),
			d("worker_query_errors_total", "Worker KV queries that failed or found nothing to recover."),
			d("workers_restored_total", "Workers restored from a dump of their cache."),
			d("events_recovered_total", "RouterEvents applied from worker KV queries."),
			d("event_gaps_total", "Jumps in a worker's event ids."),
			d("events_lost_total", "Events of such jumps no query recovered."),
			d("events_stale_total", "Live events skipped because a recovery had applied them."),
			d("workers_abandoned_total", "Workers whose recovery was given up after its queries kept failing."),
			d("events_other_residency_total", "RouterEvents of another residency domain than their worker's (a cache owner's), skipped."),
		},
		appliedKind: d("events_applied_by_kind_total", "RouterEvents applied to the index, per kind.", "kind"),
	}
}

func dynamoValues(st *dynamo.Stats) []uint64 {
	return []uint64{st.Received, st.Malformed, st.Skipped, st.Gaps, st.Lost, st.Duplicates, st.Restarts,
		st.Applied, st.ApplyErrs, st.UnknownParents, st.Resets, st.LoadReports, st.LoadErrs, st.Reconnects,
		st.Queries, st.QueryErrs, st.Restored, st.Recovered, st.EventGaps, st.LostEvents, st.StaleEvents, st.Abandoned,
		st.OtherResidency}
}

// Add starts exporting s under the subscriber label name, replacing any
// source of that name. Bytes of name that are not valid UTF-8 are exported
// as U+FFFD, and names exported as the same label value are one name (see
// Collector.Add).
func (c *DynamoCollector) Add(name string, s DynamoSource) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources[labelValue(name)] = s
}

// Remove stops exporting the source of that name (or of any name exported
// as the same label value).
func (c *DynamoCollector) Remove(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sources, labelValue(name))
}

// Describe implements prometheus.Collector.
func (c *DynamoCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
	ch <- c.appliedKind
}

// Collect implements prometheus.Collector.
func (c *DynamoCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	stats := make(map[string]dynamo.Stats, len(c.sources))
	for name, s := range c.sources {
		stats[name] = s.Stats()
	}
	c.mu.Unlock()
	for name, st := range stats {
		for i, v := range dynamoValues(&st) {
			ch <- prometheus.MustNewConstMetric(c.descs[i], prometheus.CounterValue, float64(v), name)
		}
		for kind, v := range map[string]uint64{"stored": st.AppliedStored, "removed": st.AppliedRemoved, "cleared": st.AppliedCleared} {
			ch <- prometheus.MustNewConstMetric(c.appliedKind, prometheus.CounterValue, float64(v), name, kind)
		}
	}
}
