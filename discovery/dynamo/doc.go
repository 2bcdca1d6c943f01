// Package dynamo discovers the workers of an NVIDIA Dynamo deployment from
// Dynamo's discovery store, so that a kvroute router can route them.
//
// Dynamo's workers register in a key-value store: files under the
// directory DYN_FILE_KV (--discovery-backend file) or etcd keys
// (--discovery-backend etcd), in four buckets:
//
//   - v1/instances: each endpoint a process serves, with its instance_id
//     (the worker's id) and request-plane address;
//   - v1/mdc: the model deployment card of each instance: model name, KV
//     block size, KV cache size (runtime_config.total_kv_blocks) and
//     data-parallel ranks;
//   - v1/event_channels: each event-plane publisher (topics kv-events,
//     kv_metrics, forward-pass-metrics, ...) and its ZMQ endpoint;
//   - v1/event_sources: which worker and data-parallel rank a kv-events
//     publisher speaks for.
//
// A FileWatcher or an EtcdWatcher follows the store, joins these records
// into a Deployment (the ready Workers a Selector picks and their load
// channels) and hands it to a Sink each time it changes.
//
// # Usage with a discovery.Pool
//
//  1. Create the router with the deployment's block size (a worker whose
//     kv_cache_block_size differs is refused with
//     enginemetrics.ErrBlockSize).
//  2. Create an event-plane subscriber (package kvevents/dynamo) that
//     applies kv-events to the router's index and load reports to the
//     router, and run it.
//  3. Create a discovery.Pool whose PoolConfig.DynamoEvents is
//     KVEvents(subscriber).
//  4. Run a watcher with PoolSink(pool, subscriber): each Worker becomes a
//     discovery.Engine whose ID is the instance id, so the router's choice
//     can be forwarded to Dynamo's frontend as the
//     x-dynamo-worker-instance-id header; its kv-events publishers and the
//     deployment's load channels are followed. A worker that leaves the
//     store has its publishers dropped, then is removed from the router.
//
// In code:
//
//	sub, err := kvdynamo.New(kvdynamo.Config{Sink: r.Index(), Load: r})
//	if err != nil {
//		return err
//	}
//	go sub.Run(ctx)
//	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, DynamoEvents: dynamo.KVEvents(sub)})
//	if err != nil {
//		return err
//	}
//	defer pool.Close()
//	w := &dynamo.FileWatcher{Dir: os.Getenv("DYN_FILE_KV"), Selector: dynamo.Selector{Model: "llama"}}
//	return w.Run(ctx, dynamo.PoolSink(pool, sub))
//
// # Multi-node data parallelism
//
// Dynamo numbers data-parallel ranks across a deployment: a worker whose
// model card has data_parallel_start_rank S and data_parallel_size N
// serves ranks S to S+N-1, and its events, load reports and recovery
// queries name those ranks. A router models a worker's ranks as 0 to N-1:
// Worker.Engine maps rank S+r to r, PoolSink and NATSSink give the
// event-plane subscriber each worker's start rank (DPStartRanks) before
// the worker is registered, so that events are counted from it, and the
// request forwarded to Dynamo's frontend must name rank S+r in
// x-dynamo-dp-rank (the subscriber's DPStartRank gives S).
//
// With Dynamo's NATS event plane (--event-plane nats) the workers of an
// endpoint publish on shared subjects: follow them with a
// kvevents/dynamo NATSSubscriber through NATSSink, after the pool:
//
//	w.Run(ctx, dynamo.Sinks{dynamo.PoolSink(pool, nil), dynamo.NATSSink(natsSub)})
//
// # Liveness
//
// In etcd every key a process writes is under its lease (the lease id is
// the instance id; Dynamo 1.6.1 grants 30 s), so a dead worker's keys
// expire with it and a clean stop revokes them at once. The file store has no leases: a writer
// touches its files every few seconds and deletes them when it stops
// cleanly; a FileWatcher counts a file older than its TTL (Dynamo's 10 s)
// as gone, so a killed worker leaves within TTL plus one Resync.
package dynamo
