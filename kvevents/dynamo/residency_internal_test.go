package dynamo

import (
	"context"
	"log/slog"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
)

// TestCacheOwnerEventsSkipped: a cache owner's events (residency_domain
// "cache_owner") relayed beside a worker's are skipped and counted in
// OtherResidency, not as malformed, and leave the worker's blocks as the
// worker's own events made them, a cache owner's clear included.
func TestCacheOwnerEventsSkipped(t *testing.T) {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	stored := kvevents.DynamoEvent{WorkerID: 7, Kind: kvevents.DynamoStored, ResidencyDomain: kvevents.ResidencyWorker}
	for _, b := range h.AppendBlockHashes(nil, toks) {
		stored.Blocks = append(stored.Blocks, kvevents.DynamoBlock{BlockHash: uint64(b), TokensHash: uint64(b)})
	}
	owner := kvevents.DynamoEvent{WorkerID: 7, EventID: 1, Kind: kvevents.DynamoCleared, ResidencyDomain: "cache_owner"}
	payload, err := AppendRouterEvents(nil, []kvevents.DynamoEvent{stored, owner})
	if err != nil {
		t.Fatal(err)
	}
	ix, err := indexer.New(indexer.Config{Hasher: h})
	if err != nil {
		t.Fatal(err)
	}
	var st counters
	var starts dpStarts
	c := newCore(context.Background(), ix, nopLoad{}, &Querier{}, 0, slog.New(slog.DiscardHandler), &st, &starts)
	c.handle(TopicKVEvents, &Envelope{Topic: TopicKVEvents, PublisherID: 1, Sequence: 0, Payload: payload}, source{}, 1)

	got := st.snapshot()
	if got.OtherResidency != 1 || got.Malformed != 0 || got.Applied != 1 {
		t.Fatalf("other residency %d, malformed %d, applied %d; want 1, 0, 1", got.OtherResidency, got.Malformed, got.Applied)
	}
	var r indexer.MatchResult
	ix.Match(h.AppendSeqHashes(nil, toks), &r)
	if r.Blocks != 2 {
		t.Fatalf("worker 7 holds %d blocks after its cache owner's clear, want 2", r.Blocks)
	}
}
