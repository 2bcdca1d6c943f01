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
//  2. Create a discovery.Pool whose PoolConfig.DynamoEvents subscribes to
//     a worker's kv-events publishers (package kvevents/dynamo).
//  3. Run a watcher with EngineSink(pool): each Worker becomes a
//     discovery.Engine whose ID is the instance id, so the router's choice
//     can be forwarded to Dynamo's frontend as the
//     x-dynamo-worker-instance-id header. Workers that leave the store
//     have their subscribers stopped, then are removed from the router.
//
// In code:
//
//	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, DynamoEvents: subscribe})
//	if err != nil {
//		return err
//	}
//	defer pool.Close()
//	w := &dynamo.FileWatcher{Dir: os.Getenv("DYN_FILE_KV"), Selector: dynamo.Selector{Model: "llama"}}
//	return w.Run(ctx, dynamo.EngineSink(pool))
//
// # Liveness
//
// In etcd every key a process writes is under its lease, so a dead
// worker's keys expire with it. The file store has no leases: a writer
// touches its files every few seconds and deletes them when it stops
// cleanly; a FileWatcher counts a file older than its TTL (Dynamo's 10 s)
// as gone, so a killed worker leaves within TTL plus one Resync.
package dynamo
