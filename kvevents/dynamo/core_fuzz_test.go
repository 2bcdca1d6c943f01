package dynamo

import (
	"context"
	"log/slog"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/scheduling"
)

type nopLoad struct{}

func (nopLoad) Heartbeat(kvroute.WorkerKey, scheduling.Load) error { return nil }

// FuzzCore feeds arbitrary messages to the subscriber's core after a valid
// store: it never panics, and a worker the input does not name keeps its
// blocks. Workers 9 and the guard have ranks starting at 4 and 2 (multi-node
// data parallelism), so inputs also name ranks below a worker's start.
func FuzzCore(f *testing.F) {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	guard := kvroute.WorkerKey{ID: 424242}
	const guardPub = 77
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	valid := kvevents.DynamoEvent{WorkerID: uint64(guard.ID), DPRank: 2, Kind: kvevents.DynamoStored}
	for _, b := range h.AppendBlockHashes(nil, toks) {
		valid.Blocks = append(valid.Blocks, kvevents.DynamoBlock{BlockHash: uint64(b), TokensHash: uint64(b)})
	}
	validPayload, err := AppendRouterEvents(nil, []kvevents.DynamoEvent{valid})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint8(0), uint64(1), uint64(0), validPayload)
	f.Add(uint8(1), uint64(2), uint64(3), AppendActiveLoad(nil, &ActiveLoad{WorkerID: 9, KVUsedBlocks: OptUint{5, true}}))
	f.Add(uint8(2), uint64(3), uint64(0), AppendForwardPassMetrics(nil, &ForwardPassMetrics{WorkerID: 9, Queued: RequestStats{PrefillRequests: 1}}))
	below := valid
	below.WorkerID, below.DPRank = 9, 3
	belowPayload, err := AppendRouterEvents(nil, []kvevents.DynamoEvent{below})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint8(0), uint64(4), uint64(0), belowPayload)
	f.Add(uint8(1), uint64(5), uint64(0), AppendActiveLoad(nil, &ActiveLoad{WorkerID: 9, DPRank: 1, KVUsedBlocks: OptUint{5, true}}))
	f.Add(uint8(2), uint64(6), uint64(0), AppendForwardPassMetrics(nil, &ForwardPassMetrics{WorkerID: 9, DPRank: 7}))
	seqs := h.AppendSeqHashes(nil, toks)
	f.Fuzz(func(t *testing.T, topic uint8, pub, seq uint64, payload []byte) {
		ix, err := indexer.New(indexer.Config{Hasher: h})
		if err != nil {
			t.Fatal(err)
		}
		var st counters
		var starts dpStarts
		if err := starts.set(map[uint64]int{9: 4, uint64(guard.ID): 2}); err != nil {
			t.Fatal(err)
		}
		c := newCore(context.Background(), ix, nopLoad{}, &Querier{}, 0, slog.New(slog.DiscardHandler), &st, &starts)
		c.handle(TopicKVEvents, &Envelope{Topic: TopicKVEvents, PublisherID: guardPub, Sequence: 3, Payload: validPayload}, source{}, 1)
		topics := []string{TopicKVEvents, TopicKVMetrics, TopicForwardPassMetrics, TopicActiveSequences}
		name := topics[int(topic)%len(topics)]
		for range 2 { // twice: the second is a duplicate or a restart
			c.handle(name, &Envelope{Topic: name, PublisherID: pub, Sequence: seq, Payload: payload}, source{capacity: 10, blockSize: 4}, 1)
		}
		if pub == guardPub {
			return
		}
		if name == TopicKVEvents {
			evs, _ := DecodeRouterEvents(nil, payload)
			for _, e := range evs {
				if e.WorkerID == uint64(guard.ID) {
					return
				}
			}
		}
		var r indexer.MatchResult
		ix.Match(seqs, &r)
		if r.Blocks != 2 {
			t.Fatalf("the guard worker lost its blocks: %d", r.Blocks)
		}
	})
}
