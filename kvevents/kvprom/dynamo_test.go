package kvprom_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/kvevents/dynamo"
	"github.com/kvroute/kvroute/kvevents/kvprom"
)

type fixedDynamo dynamo.Stats

func (f fixedDynamo) Stats() dynamo.Stats { return dynamo.Stats(f) }

func TestDynamoCollector(t *testing.T) {
	c := kvprom.NewDynamo("kvroute")
	c.Add("zmq", fixedDynamo{Received: 10, Gaps: 2, Lost: 5, Malformed: 1, LoadReports: 7, AppliedStored: 3, Abandoned: 1, OtherResidency: 4})
	c.Add("gone", fixedDynamo{})
	c.Remove("gone")
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_dynamo_events_gaps_total Jumps in a publisher's sequence.
# TYPE kvroute_dynamo_events_gaps_total counter
kvroute_dynamo_events_gaps_total{subscriber="zmq"} 2
# HELP kvroute_dynamo_events_messages_lost_total Messages the sequence gaps skipped over.
# TYPE kvroute_dynamo_events_messages_lost_total counter
kvroute_dynamo_events_messages_lost_total{subscriber="zmq"} 5
# HELP kvroute_dynamo_events_messages_malformed_total Messages or payloads that did not decode and were skipped (no reset).
# TYPE kvroute_dynamo_events_messages_malformed_total counter
kvroute_dynamo_events_messages_malformed_total{subscriber="zmq"} 1
# HELP kvroute_dynamo_events_workers_abandoned_total Workers whose recovery was given up after its queries kept failing.
# TYPE kvroute_dynamo_events_workers_abandoned_total counter
kvroute_dynamo_events_workers_abandoned_total{subscriber="zmq"} 1
# HELP kvroute_dynamo_events_events_other_residency_total RouterEvents of another residency domain than their worker's (a cache owner's), skipped.
# TYPE kvroute_dynamo_events_events_other_residency_total counter
kvroute_dynamo_events_events_other_residency_total{subscriber="zmq"} 4
# HELP kvroute_dynamo_events_load_reports_total Heartbeats sent to the router from kv_metrics and forward-pass-metrics.
# TYPE kvroute_dynamo_events_load_reports_total counter
kvroute_dynamo_events_load_reports_total{subscriber="zmq"} 7
# HELP kvroute_dynamo_events_events_applied_by_kind_total RouterEvents applied to the index, per kind.
# TYPE kvroute_dynamo_events_events_applied_by_kind_total counter
kvroute_dynamo_events_events_applied_by_kind_total{kind="cleared",subscriber="zmq"} 0
kvroute_dynamo_events_events_applied_by_kind_total{kind="removed",subscriber="zmq"} 0
kvroute_dynamo_events_events_applied_by_kind_total{kind="stored",subscriber="zmq"} 3
`), "kvroute_dynamo_events_gaps_total", "kvroute_dynamo_events_messages_lost_total",
		"kvroute_dynamo_events_messages_malformed_total", "kvroute_dynamo_events_load_reports_total",
		"kvroute_dynamo_events_events_applied_by_kind_total", "kvroute_dynamo_events_workers_abandoned_total",
		"kvroute_dynamo_events_events_other_residency_total"))
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	require.Equal(t, 23+3, n)
}
