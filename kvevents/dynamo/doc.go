// Package dynamo subscribes to NVIDIA Dynamo's event plane: the KV events
// and load reports Dynamo workers publish for Dynamo's own router, applied
// to a kvroute index and router.
//
// It reads Dynamo 1.6.1's wire format as its publishers send it: over ZMQ
// (one PUB socket per worker and topic, listed in Dynamo's discovery under
// v1/event_channels) and over NATS (one subject per endpoint and topic).
//
// # Usage
//
//  1. Create a [Subscriber] with the index as Config.Sink and, for load
//     reports, the router as Config.Load. Register Dynamo workers in the
//     router under their instance ids (RouterEvents name their worker by
//     it), with the engine's block size.
//  2. Run [Subscriber.Run] on a goroutine of your own. For workers whose
//     data-parallel ranks do not start at 0 (model card
//     data_parallel_start_rank above 0: the later nodes of a multi-node
//     data-parallel deployment), call [Subscriber.SetDPStartRanks] before
//     adding their publishers: Dynamo names their ranks from the start
//     rank, the router from 0.
//  3. For each event channel discovery reports (topics "kv-events",
//     "kv_metrics", "forward-pass-metrics"), call
//     [Subscriber.AddPublisher] with its endpoint and topic, and the
//     worker's KV capacity and block size from its model card; for
//     "kv-events", add the worker's recovery target from
//     v1/event_sources ([ParseRecoveryTarget]) so that the subscriber
//     restores what the worker cached before it joined and what a gap
//     lost, from the worker's local indexer ([Querier]). Call
//     [Subscriber.RemovePublisher] when the channel goes away.
//  4. Read [Subscriber.Stats] for monitoring (kvevents/kvprom exports
//     them).
//
// On Dynamo's NATS event plane, [NATSSubscriber] does the same with a
// *nats.Conn and subjects ([NATSSubscriber.AddChannel]).
//
// In code:
//
//	sub, err := dynamo.New(dynamo.Config{Sink: index, Load: rtr})
//	if err != nil {
//		return err
//	}
//	go sub.Run(ctx)
//	tgt, err := dynamo.ParseRecoveryTarget(
//		"10.0.0.7:37889/15eb28d827b01bdb/dynamo/backend/worker_kv_query_source_10486e22fd3afa",
//		workerID, 0)
//	if err != nil {
//		return err
//	}
//	_ = sub.AddPublisher(dynamo.Publisher{
//		Endpoint: "tcp://10.0.0.7:44351", Topic: dynamo.TopicKVEvents, Recovery: &tgt,
//	})
//	_ = sub.AddPublisher(dynamo.Publisher{
//		Endpoint: "tcp://10.0.0.7:33257", Topic: dynamo.TopicForwardPassMetrics,
//		KVCapacityBlocks: 800, BlockSize: 16,
//	})
//
// # Wire format
//
// A ZMQ message has four frames: the topic, the publisher id and the
// sequence number (8-byte big-endian integers), and a data frame: a
// version byte (1), the envelope's length (4 bytes, big-endian) and the
// envelope, a msgpack map {topic, publisher_id, sequence, published_at,
// payload} ([Envelope]). Over NATS the message body is the envelope alone,
// on subject namespace.<ns>.component.<component>.endpoint.<endpoint>.<topic>
// ([Subject]). The payload is msgpack with field names: on "kv-events" a
// list of RouterEvents (kvevents.DynamoEvent), on "kv_metrics" an
// [ActiveLoad], on "forward-pass-metrics" [ForwardPassMetrics].
//
// RouterEvents carry Dynamo's tokens_hash for each block: the XXH3 hash
// of the block's tokens that kvroute.Hasher computes too, so the index
// matches requests hashed by the router, without token ids on the wire.
//
// A recovery query goes to the worker's endpoint on Dynamo's TCP request
// plane (see [Querier]): the endpoint path, JSON headers and a two-part
// message (a JSON control header naming a callback address, the msgpack
// request {worker_id, dp_rank, start_event_id, end_event_id}); the worker
// acknowledges, connects back and streams a handshake, a prologue and the
// msgpack response (TreeDump or Events of RouterEvents).
//
// Decoders never panic on their input and are fuzzed with frames captured
// from Dynamo's own publishers (kvevents/testdata/captured).
package dynamo
