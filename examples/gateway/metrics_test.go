package main

import (
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/kvevents"
)

// TestRunExportsIngestionCounters: GET /metrics serves the KV-event
// ingestion counters of each engine's subscriber (package kvevents/kvprom)
// beside the router's: a valid batch and a malformed payload published on
// the engine's events endpoint show up as applied events and a malformed
// batch of engine "1/0".
func TestRunExportsIngestionCounters(t *testing.T) {
	pub := zmq4.NewPub(context.Background())
	t.Cleanup(func() { _ = pub.Close() })
	require.NoError(t, pub.Listen("tcp://127.0.0.1:0"))
	events := "tcp://" + pub.Addr().String()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addr, stop := startCommand(t, ctx, "-engine", "1=http://127.0.0.1:1,events="+events+",topic=kv")
	defer func() { require.NoError(t, stop()) }()

	tokens := make([]uint32, 16)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	valid, err := kvevents.AppendBatch(nil, &kvevents.Batch{Timestamp: 1, RankSlot: true, Events: []kvevents.EngineEvent{{
		Type: kvevents.BlockStored, BlockHashes: []kvevents.Hash{kvevents.UintHash(1)}, TokenIDs: tokens, BlockSize: 16,
	}}})
	require.NoError(t, err)
	malformed := []byte{0xc1} // a msgpack byte that is never used

	counter := func(body, name string) int {
		m := regexp.MustCompile(`(?m)^kvroute_kvevents_` + name + `\{engine="1/0"\} (\d+)$`).FindStringSubmatch(body)
		if m == nil {
			return -1
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	scrape := func() string {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+"/metrics", nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(body)
	}
	require.Equal(t, 0, counter(scrape(), "batches_malformed_total"), "the subscriber's counters are exported from the start")

	// A PUB socket drops what is sent before the subscriber has joined:
	// publish until both have been counted.
	var seq uint64
	var body string
	require.Eventually(t, func() bool {
		for _, p := range [][]byte{valid, malformed} {
			_ = pub.Send(zmq4.NewMsgFrom([]byte("kv"), binary.BigEndian.AppendUint64(nil, seq), p))
			seq++
		}
		body = scrape()
		return counter(body, "batches_malformed_total") > 0 && counter(body, "events_applied_total") > 0
	}, 10*time.Second, 20*time.Millisecond)
	require.Greater(t, counter(body, "batches_received_total"), 1)
	require.Regexp(t, `kvroute_kvevents_events_applied_by_kind_total\{engine="1/0",kind="stored"\} [1-9]`, body)
	require.Contains(t, body, "kvroute_router_", "the router's metrics are served beside them")
}
