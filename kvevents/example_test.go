package kvevents_test

import (
	"fmt"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
)

// Decode a vLLM batch, convert it and look at the result.
func Example() {
	// What a vLLM engine with data-parallel rank 1 publishes for one root
	// block of 4 tokens (block size 4) cached on the GPU.
	payload, err := kvevents.AppendBatch(nil, &kvevents.Batch{
		Timestamp: 1757500000.25,
		DPRank:    kvevents.Some(1),
		RankSlot:  true,
		Events: []kvevents.EngineEvent{{
			Type:        kvevents.BlockStored,
			BlockHashes: []kvevents.Hash{kvevents.UintHash(0xdeadbeef)},
			TokenIDs:    []uint32{0, 1, 2, 3},
			BlockSize:   4,
			Medium:      kvevents.MediumGPU,
		}},
	})
	if err != nil {
		panic(err)
	}

	conv, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: 7, BlockSize: 4})
	if err != nil {
		panic(err)
	}
	var batch kvevents.Batch
	if err := kvevents.DecodeBatch(payload, &batch); err != nil {
		panic(err)
	}
	evs, err := conv.Convert(nil, &batch)
	if err != nil {
		panic(err)
	}
	for _, ev := range evs {
		fmt.Println(ev.String())
		fmt.Printf("external %#x, block hash %#x\n", uint64(ev.Blocks[0].External), uint64(ev.Blocks[0].Hash))
	}
	// Output:
	// stored{worker=7/1 id=0 tier=device blocks=1}
	// external 0xdeadbeef, block hash 0x7ee2cbedc694ab46
}

// A byte-string hash (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) is
// keyed by its last 8 bytes, big-endian: the integer vLLM would have sent.
func ExampleBytesKey() {
	digest := make([]byte, 32)
	digest[31] = 0x2a
	fmt.Println(kvevents.BytesKey(digest))
	fmt.Println(kvevents.BytesHash(digest).External() == kvroute.ExternalHash(42))
	// Output:
	// 42
	// true
}

// Dynamo's RouterEvent numbers events from 0; kvroute IDs are event_id+1.
func ExampleDynamoEvent_ToEvent() {
	var d kvevents.DynamoEvent
	line := `{"worker_id": 9, "storage_tier": "host_pinned", "event": {"event_id": 5, "data": {"removed": {"block_hashes": [42]}}, "dp_rank": 0}}`
	if err := d.UnmarshalJSON([]byte(line)); err != nil {
		panic(err)
	}
	var ev kvroute.Event
	if err := d.ToEvent(&ev); err != nil {
		panic(err)
	}
	fmt.Println(ev.String())
	// Output: removed{worker=9/0 id=6 tier=host blocks=1}
}
