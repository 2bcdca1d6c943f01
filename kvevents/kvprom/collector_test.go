package kvprom_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/kvprom"
	"github.com/kvroute/kvroute/kvevents/zmq"
)

type fixed zmq.Stats

func (f fixed) Stats() zmq.Stats { return zmq.Stats(f) }

func TestCollectorExportsEveryCounter(t *testing.T) {
	c := kvprom.New("kvroute")
	c.Add("e1", fixed{Received: 10, Malformed: 3, Resets: 1, UnknownParents: 2, Gaps: 4, Replayed: 5,
		AppliedStored: 7, AppliedRemoved: 2, AppliedCleared: 1,
		Convert: kvevents.ConvertStats{SkippedGroupEvents: 6, SkippedGroupBlocks: 60, BlockSizeRejects: 8, Rechunked: 9,
			InvalidEvents: 4, UnknownTypes: 5, TierCopies: 6, StateClears: 11}})
	c.Add("e2", fixed{})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_kvevents_batches_malformed_total Batches that did not decode and were skipped (no reset).
# TYPE kvroute_kvevents_batches_malformed_total counter
kvroute_kvevents_batches_malformed_total{engine="e1"} 3
kvroute_kvevents_batches_malformed_total{engine="e2"} 0
# HELP kvroute_kvevents_events_applied_by_kind_total Events applied to the index, per kind.
# TYPE kvroute_kvevents_events_applied_by_kind_total counter
kvroute_kvevents_events_applied_by_kind_total{engine="e1",kind="cleared"} 1
kvroute_kvevents_events_applied_by_kind_total{engine="e1",kind="removed"} 2
kvroute_kvevents_events_applied_by_kind_total{engine="e1",kind="stored"} 7
kvroute_kvevents_events_applied_by_kind_total{engine="e2",kind="cleared"} 0
kvroute_kvevents_events_applied_by_kind_total{engine="e2",kind="removed"} 0
kvroute_kvevents_events_applied_by_kind_total{engine="e2",kind="stored"} 0
# HELP kvroute_kvevents_group_blocks_skipped_total Block hashes of skipped KV-cache group events.
# TYPE kvroute_kvevents_group_blocks_skipped_total counter
kvroute_kvevents_group_blocks_skipped_total{engine="e1"} 60
kvroute_kvevents_group_blocks_skipped_total{engine="e2"} 0
# HELP kvroute_kvevents_block_size_rejects_total Stored events rejected for their block size.
# TYPE kvroute_kvevents_block_size_rejects_total counter
kvroute_kvevents_block_size_rejects_total{engine="e1"} 8
kvroute_kvevents_block_size_rejects_total{engine="e2"} 0
# HELP kvroute_kvevents_events_invalid_total Events with an unusable field, skipped alone.
# TYPE kvroute_kvevents_events_invalid_total counter
kvroute_kvevents_events_invalid_total{engine="e1"} 4
kvroute_kvevents_events_invalid_total{engine="e2"} 0
# HELP kvroute_kvevents_unknown_type_events_total Events of types kvevents does not know, skipped.
# TYPE kvroute_kvevents_unknown_type_events_total counter
kvroute_kvevents_unknown_type_events_total{engine="e1"} 5
kvroute_kvevents_unknown_type_events_total{engine="e2"} 0
# HELP kvroute_kvevents_tier_copy_events_total Stored events of another tier without tokens, stored from what device stores said of their blocks.
# TYPE kvroute_kvevents_tier_copy_events_total counter
kvroute_kvevents_tier_copy_events_total{engine="e1"} 6
kvroute_kvevents_tier_copy_events_total{engine="e2"} 0
# HELP kvroute_kvevents_converter_state_clears_total Times one of the converter's bounded memories (salts, kinds, re-chunking tails, tier copies) filled up and was cleared.
# TYPE kvroute_kvevents_converter_state_clears_total counter
kvroute_kvevents_converter_state_clears_total{engine="e1"} 11
kvroute_kvevents_converter_state_clears_total{engine="e2"} 0
# HELP kvroute_kvevents_gaps_total Sequence gaps seen.
# TYPE kvroute_kvevents_gaps_total counter
kvroute_kvevents_gaps_total{engine="e1"} 4
kvroute_kvevents_gaps_total{engine="e2"} 0
# HELP kvroute_kvevents_unknown_parents_total Stored events rejected for an unknown parent block.
# TYPE kvroute_kvevents_unknown_parents_total counter
kvroute_kvevents_unknown_parents_total{engine="e1"} 2
kvroute_kvevents_unknown_parents_total{engine="e2"} 0
# HELP kvroute_kvevents_worker_resets_total Worker resets sent to the index.
# TYPE kvroute_kvevents_worker_resets_total counter
kvroute_kvevents_worker_resets_total{engine="e1"} 1
kvroute_kvevents_worker_resets_total{engine="e2"} 0
`), "kvroute_kvevents_batches_malformed_total", "kvroute_kvevents_events_applied_by_kind_total",
		"kvroute_kvevents_group_blocks_skipped_total", "kvroute_kvevents_block_size_rejects_total",
		"kvroute_kvevents_gaps_total", "kvroute_kvevents_unknown_parents_total", "kvroute_kvevents_worker_resets_total",
		"kvroute_kvevents_events_invalid_total", "kvroute_kvevents_unknown_type_events_total",
		"kvroute_kvevents_tier_copy_events_total", "kvroute_kvevents_converter_state_clears_total"))
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	require.Equal(t, 2*(26+3), n)
	c.Remove("e2")
	n, err = testutil.GatherAndCount(reg)
	require.NoError(t, err)
	require.Equal(t, 26+3, n)
}

// TestCollectorLabelNotUTF8: a source name that is not valid UTF-8 (an
// engine name taken from bytes) is exported with its invalid bytes
// replaced, beside the other sources, instead of panicking the scrape.
func TestCollectorLabelNotUTF8(t *testing.T) {
	c := kvprom.New("kvroute")
	c.Add("engine-\xff", fixed{Received: 4})
	c.Add("e2", fixed{Received: 2})
	dc := kvprom.NewDynamo("kvroute")
	dc.Add("sub-\xfe", fixedDynamo{Received: 3})
	for _, col := range []prometheus.Collector{c, dc} {
		require.NotPanics(t, func() {
			ch := make(chan prometheus.Metric, 1024)
			col.Collect(ch)
			close(ch)
			for range ch {
			}
		})
	}
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	require.NoError(t, reg.Register(dc))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_kvevents_batches_received_total Batches received on the PUB socket.
# TYPE kvroute_kvevents_batches_received_total counter
kvroute_kvevents_batches_received_total{engine="e2"} 2
kvroute_kvevents_batches_received_total{engine="engine-�"} 4
# HELP kvroute_dynamo_events_messages_received_total Event-plane messages received, of every topic.
# TYPE kvroute_dynamo_events_messages_received_total counter
kvroute_dynamo_events_messages_received_total{subscriber="sub-�"} 3
`), "kvroute_kvevents_batches_received_total", "kvroute_dynamo_events_messages_received_total"))
}

// TestCollectorLabelCollision: source names that export as the same label
// value (names whose invalid bytes differ, or a name and its U+FFFD
// spelling) are one source, the last added, so that the scrape never
// carries one series twice, which fails the whole scrape.
func TestCollectorLabelCollision(t *testing.T) {
	c := kvprom.New("kvroute")
	c.Add("engine-\xff", fixed{Received: 4})
	c.Add("engine-\xfe", fixed{Received: 5})
	c.Add("e2", fixed{Received: 2})
	dc := kvprom.NewDynamo("kvroute")
	dc.Add("sub-\xfe", fixedDynamo{Received: 3})
	dc.Add("sub-\uFFFD", fixedDynamo{Received: 6})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	require.NoError(t, reg.Register(dc))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_kvevents_batches_received_total Batches received on the PUB socket.
# TYPE kvroute_kvevents_batches_received_total counter
kvroute_kvevents_batches_received_total{engine="e2"} 2
kvroute_kvevents_batches_received_total{engine="engine-�"} 5
# HELP kvroute_dynamo_events_messages_received_total Event-plane messages received, of every topic.
# TYPE kvroute_dynamo_events_messages_received_total counter
kvroute_dynamo_events_messages_received_total{subscriber="sub-�"} 6
`), "kvroute_kvevents_batches_received_total", "kvroute_dynamo_events_messages_received_total"))
	c.Remove("engine-\xff")
	dc.Remove("sub-\xfe")
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	require.Equal(t, 26+3, n, "only e2 is left")
}
