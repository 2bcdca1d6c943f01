// Package kvprom exports KV-event ingestion counters (ZMQ subscribers and
// their converters, Dynamo event-plane subscribers) as Prometheus metrics,
// beside router/routerprom.
//
// It lives in its own package so that the transports do not depend on the
// Prometheus client.
//
// # Usage
//
//	c := kvprom.New("kvroute")
//	c.Add("engine-7", sub) // a *zmq.Subscriber, or anything with Stats() zmq.Stats
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(c)
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// Every metric is a counter labelled with the engine name given to Add.
//
// Subscribers of Dynamo's event plane (package kvevents/dynamo) have their
// own collector, [DynamoCollector], labelled with a subscriber name:
//
//	dc := kvprom.NewDynamo("kvroute")
//	dc.Add("dynamo", sub) // a *dynamo.Subscriber or *dynamo.NATSSubscriber
//	reg.MustRegister(dc)
package kvprom

import (
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/kvevents/zmq"
)

// Source is what the Collector reads on every scrape: a *zmq.Subscriber.
type Source interface {
	Stats() zmq.Stats
}

// Collector is a prometheus.Collector that reads the Stats of every added
// Source on each scrape. It is safe for concurrent use.
type Collector struct {
	mu      sync.Mutex
	sources map[string]Source

	received, replayed, applied, gaps, dropped, duplicates *prometheus.Desc
	malformed, applyErrs, unknownParents, restarts         *prometheus.Desc
	resets, reconnects, appliedKind                        *prometheus.Desc
	skippedEvents, droppedBlocks, skippedGroups            *prometheus.Desc
	skippedGroupBlocks, blockSizeRejects, rechunked        *prometheus.Desc
	unknownLoRA, invalid, salted, mmBlocks, notLocal       *prometheus.Desc
	unknownTypes, tierCopies, stateClears                  *prometheus.Desc
}

// New returns a Collector whose metric names start with namespace (for
// example "kvroute"), followed by "kvevents".
func New(namespace string) *Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "kvevents", name), help, append([]string{"engine"}, labels...), nil)
	}
	return &Collector{
		sources:            make(map[string]Source),
		received:           d("batches_received_total", "Batches received on the PUB socket."),
		replayed:           d("batches_replayed_total", "Batches recovered through the replay socket."),
		applied:            d("events_applied_total", "Events applied to the index without error."),
		appliedKind:        d("events_applied_by_kind_total", "Events applied to the index, per kind.", "kind"),
		gaps:               d("gaps_total", "Sequence gaps seen."),
		dropped:            d("batches_lost_total", "Batches lost for good (the worker was reset)."),
		duplicates:         d("batches_duplicate_total", "Batches received again and skipped."),
		malformed:          d("batches_malformed_total", "Batches that did not decode and were skipped (no reset)."),
		applyErrs:          d("apply_errors_total", "Events the index rejected."),
		unknownParents:     d("unknown_parents_total", "Stored events rejected for an unknown parent block."),
		restarts:           d("publisher_restarts_total", "Publisher restarts detected."),
		resets:             d("worker_resets_total", "Worker resets sent to the index."),
		reconnects:         d("reconnects_total", "Connections (re)established to the publisher."),
		skippedEvents:      d("events_skipped_total", "Events conversion left out, for any reason."),
		droppedBlocks:      d("blocks_dropped_total", "Stored block hashes without a full block of tokens."),
		skippedGroups:      d("group_events_skipped_total", "Events of KV-cache groups that do not decide prefix reuse."),
		skippedGroupBlocks: d("group_blocks_skipped_total", "Block hashes of skipped KV-cache group events."),
		blockSizeRejects:   d("block_size_rejects_total", "Stored events rejected for their block size."),
		rechunked:          d("rechunked_events_total", "Stored events re-chunked into the router's block size."),
		unknownLoRA:        d("unknown_lora_total", "Stored events whose lora_id has no name."),
		invalid:            d("events_invalid_total", "Events with an unusable field, skipped alone."),
		unknownTypes:       d("unknown_type_events_total", "Events of types kvevents does not know, skipped."),
		tierCopies:         d("tier_copy_events_total", "Stored events of another tier without tokens, stored from what device stores said of their blocks."),
		salted:             d("salted_events_total", "Stored events hashed under a cache salt."),
		mmBlocks:           d("multimodal_blocks_total", "Blocks hashed with multimodal items."),
		notLocal:           d("not_local_events_total", "Events about blocks the engine does not hold itself (locality, ownership)."),
		stateClears:        d("converter_state_clears_total", "Times one of the converter's bounded memories (salts, kinds, re-chunking tails, tier copies) filled up and was cleared."),
	}
}

// Add starts exporting s under the engine label name, replacing any source
// of that name. Bytes of name that are not valid UTF-8 are exported as
// U+FFFD, and names exported as the same label value are one name: the
// source added last replaces the others, as two series of one label value
// would fail the whole scrape.
func (c *Collector) Add(name string, s Source) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources[labelValue(name)] = s
}

// Remove stops exporting the source of that name (or of any name exported
// as the same label value, see Add).
func (c *Collector) Remove(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sources, labelValue(name))
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs() {
		ch <- d
	}
	ch <- c.appliedKind
}

func (c *Collector) descs() []*prometheus.Desc {
	return []*prometheus.Desc{c.received, c.replayed, c.applied, c.gaps, c.dropped, c.duplicates,
		c.malformed, c.applyErrs, c.unknownParents, c.restarts, c.resets, c.reconnects,
		c.skippedEvents, c.droppedBlocks, c.skippedGroups, c.skippedGroupBlocks, c.blockSizeRejects,
		c.rechunked, c.unknownLoRA, c.invalid, c.salted, c.mmBlocks, c.notLocal, c.unknownTypes, c.tierCopies, c.stateClears}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	stats := make(map[string]zmq.Stats, len(c.sources))
	for name, s := range c.sources {
		stats[name] = s.Stats()
	}
	c.mu.Unlock()
	for name, st := range stats {
		values := []uint64{st.Received, st.Replayed, st.Applied, st.Gaps, st.Dropped, st.Duplicates,
			st.Malformed, st.ApplyErrs, st.UnknownParents, st.Restarts, st.Resets, st.Reconnects,
			st.Convert.SkippedEvents, st.Convert.DroppedBlocks, st.Convert.SkippedGroupEvents,
			st.Convert.SkippedGroupBlocks, st.Convert.BlockSizeRejects, st.Convert.Rechunked,
			st.Convert.UnknownLoRA, st.Convert.InvalidEvents, st.Convert.Salted, st.Convert.MMBlocks,
			st.Convert.NotLocal, st.Convert.UnknownTypes, st.Convert.TierCopies, st.Convert.StateClears}
		for i, d := range c.descs() {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(values[i]), name)
		}
		for kind, v := range map[string]uint64{"stored": st.AppliedStored, "removed": st.AppliedRemoved, "cleared": st.AppliedCleared} {
			ch <- prometheus.MustNewConstMetric(c.appliedKind, prometheus.CounterValue, float64(v), name, kind)
		}
	}
}

// labelValue returns name as a valid label value: its bytes that are not
// valid UTF-8 replaced by U+FFFD (the client panics on them).
func labelValue(name string) string {
	if utf8.ValidString(name) {
		return name
	}
	return strings.ToValidUTF8(name, "\uFFFD")
}
