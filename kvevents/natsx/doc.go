// Package natsx carries kvroute's KV events and active-request load over
// NATS, so that several router replicas each keep the full index and the
// same load view.
//
// # Usage
//
// One relay process per engine (or per cluster) and every router replica
// share a NATS server and a subject prefix:
//
//  1. In the relay, create a [Publisher] and use it as the Sink of a
//     kvevents/zmq Subscriber: each engine event becomes one message on
//     "<prefix>.events", numbered per worker.
//  2. In each router replica, create the local *indexer.Index and
//     *scheduling.Tracker, then a [Replica] with a unique ID, and run
//     [Replica.Run] on a goroutine of your own. Wait for [Replica.Ready]
//     before routing (the replica has then loaded a peer's state).
//  3. Route with the local index and tracker, and report each decision's
//     load through [Replica.Add], [Replica.PrefillDone] and [Replica.Free]
//     instead of calling the tracker: the replica applies them locally and
//     shares them with its peers.
//
// In code:
//
//	rep, err := natsx.NewReplica(natsx.ReplicaConfig{
//		Conn: nc, ID: "router-1", Index: index, Tracker: tracker,
//	})
//	if err != nil {
//		return err
//	}
//	go rep.Run(ctx)
//	<-rep.Ready()
//
// # Wire
//
// Events are Dynamo RouterEvents in named msgpack (see
// kvevents.AppendDynamoEvent), one per message. Load operations travel in
// batches [origin, ops]. A dump, requested on "<prefix>.dump" with the
// requester's inbox as reply subject, arrives as numbered chunks ending
// with a final one. Core NATS delivers at most once: a replica that misses
// an event sees a gap in the worker's sequence and resyncs from a peer.
package natsx
