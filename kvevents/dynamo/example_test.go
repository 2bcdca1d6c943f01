package dynamo_test

import (
	"context"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/dynamo"
	"github.com/kvroute/kvroute/router"
)

// A router fed by a Dynamo worker's event plane. Here a PUB socket sends
// what a Dynamo worker with instance id 2 publishes when it caches a
// system prompt; in a deployment the endpoints come from Dynamo's
// discovery (v1/event_channels).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	r, _ := router.New(router.Config{Hasher: h})
	for id := range 3 {
		_ = r.AddWorker(router.StaticWorker{WorkerID: kvroute.WorkerID(id + 1), Block: 4})
	}

	worker := zmq4.NewPub(ctx)
	defer worker.Close()
	if err := worker.Listen("tcp://127.0.0.1:0"); err != nil {
		fmt.Println(err)
		return
	}
	endpoint := "tcp://" + worker.Addr().String()

	sub, _ := dynamo.New(dynamo.Config{Sink: r.Index(), Load: r})
	_ = sub.AddPublisher(dynamo.Publisher{Endpoint: endpoint, Topic: dynamo.TopicKVEvents})
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()

	// The worker stores the system prompt's three blocks (RouterEvents
	// carry each block's tokens hash, as the router hashes prompts).
	system := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	ev := kvevents.DynamoEvent{WorkerID: 2, Kind: kvevents.DynamoStored}
	for i, b := range h.AppendBlockHashes(nil, system) {
		ev.Blocks = append(ev.Blocks, kvevents.DynamoBlock{BlockHash: uint64(100 + i), TokensHash: uint64(b)})
	}
	payload, _ := dynamo.AppendRouterEvents(nil, []kvevents.DynamoEvent{ev})
	var res indexer.MatchResult
	for seq := uint64(0); res.Blocks == 0 && ctx.Err() == nil; seq++ {
		// Resent until the subscriber has joined (ZMQ drops what a PUB
		// socket sends before a subscriber connects).
		env := dynamo.Envelope{Topic: dynamo.TopicKVEvents, PublisherID: 9, Sequence: seq, Payload: payload}
		_ = worker.SendMulti(zmq4.NewMsgFrom(dynamo.AppendZMQ(&env)...))
		time.Sleep(20 * time.Millisecond)
		r.Index().Match(h.AppendSeqHashes(nil, system), &res)
	}

	d, err := r.Select(ctx, &router.Request{Tokens: append(system, 42, 43, 44, 45)})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("worker %s, %d of %d blocks cached\n", d.Worker, d.CachedBlocks, d.Blocks)
	d.Done(router.Outcome{})
	cancel()
	<-done
	// Output: worker 2/0, 3 of 4 blocks cached
}

// ExampleDecodeZMQ decodes one message of Dynamo's ZMQ event plane.
func ExampleDecodeZMQ() {
	ev := kvevents.DynamoEvent{WorkerID: 7, Kind: kvevents.DynamoRemoved, Removed: []uint64{11, 12}}
	payload, _ := dynamo.AppendRouterEvents(nil, []kvevents.DynamoEvent{ev})
	frames := dynamo.AppendZMQ(&dynamo.Envelope{Topic: dynamo.TopicKVEvents, PublisherID: 5, Sequence: 3, Payload: payload})

	var m dynamo.Message
	if err := dynamo.DecodeZMQ(frames, &m); err != nil {
		fmt.Println(err)
		return
	}
	evs, err := dynamo.DecodeRouterEvents(nil, m.Envelope.Payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	var out kvroute.Event
	_ = evs[0].ToEvent(&out)
	fmt.Println(m.Topic, m.PublisherID, m.Sequence, out.Worker, out.Kind, out.Removed)
	// Output: kv-events 5 3 7/0 removed [11 12]
}
