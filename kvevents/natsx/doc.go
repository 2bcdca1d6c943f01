// Package natsx carries kvroute's KV events and active-request load over
// NATS, so that several router replicas each keep the full index and the
// same load view.
//
// # Usage
//
// One relay process per engine (or per cluster) and every router replica
// share a NATS server and a subject prefix:
//
//  1. In the relay, create a [Publisher], use it as the Sink of a
//     kvevents/zmq Subscriber, and run [Publisher.Serve] on a goroutine of
//     its own: each engine event becomes one message on
//     "<prefix>.events", numbered per worker, and Serve answers replicas
//     that lost some from a replay buffer bounded per worker
//     (ReplayEvents), in time (ReplayIdle) and in all (ReplayBytes). Call
//     [Publisher.RemoveWorker] when an engine leaves the pool for good.
//  2. In each router replica, create the local *indexer.Index and
//     *scheduling.Tracker, a [Replica] with a unique ID over both, and the
//     router with the same index and tracker and the Replica as its
//     router.Config.LoadSync. Run [Replica.Run] on a goroutine of your
//     own and wait for [Replica.Ready] before routing (the replica has
//     then loaded a peer's index). Give the router a
//     router.Config.RemoveGrace: the relay goes on publishing a worker's
//     events after the router removes it, so a worker removed and added
//     again within the grace keeps its blocks (its engine does not
//     announce the blocks it already holds); router.Router.PurgeWorker
//     clears a worker whose engine is gone or was replaced at once.
//  3. Route as usual: the router reports each decision's load to the
//     Replica, which shares it; the peers' requests appear in the shared
//     tracker, so Select counts every request of every replica once.
//
// In code:
//
//	tracker, _ := scheduling.NewTracker(scheduling.TrackerConfig{TTL: ttl})
//	var r *router.Router
//	rep, err := natsx.NewReplica(natsx.ReplicaConfig{
//		Conn: nc, ID: "router-1", Index: index, Tracker: tracker,
//		OnPeerLoad: func() { r.LoadChanged() },
//	})
//	if err != nil {
//		return err
//	}
//	r, err = router.New(router.Config{Index: index, LoadTracker: tracker, LoadSync: rep,
//		RemoveGrace: 5 * time.Minute})
//	if err != nil {
//		return err
//	}
//	go rep.Run(ctx)
//	<-rep.Ready()
//
// # Wire
//
// Events are Dynamo RouterEvents in named msgpack (see
// kvevents.AppendDynamoEvent), one per message, numbered per worker by the
// Publisher. The Publisher keeps each worker's latest messages and
// announces each worker's last ID on "<prefix>.heads"; replicas ask it for
// lost ones on "<prefix>.replay". A replica that sees a gap asks its peers
// on "<prefix>.have" which one is in sync with the worker and fetches that
// worker's dump from it on "<prefix>.wdump.<peer>"; a starting replica
// fetches a whole dump on "<prefix>.dump". The heads and each worker's
// new-sequence marker (in its EpochHeader) carry the Publisher's epoch,
// and dumps and these requests carry the epoch of each worker's
// sequence, so that a replica still on a restarted relay's old sequence
// neither passes it on nor is taken for one in sync. A replica that
// cannot tell which relay its sequence of a worker is from never takes
// itself for in sync with the announcing relay: it starts that worker
// over from the relay's first event. Load operations travel in
// numbered batches on "<prefix>.load", with heartbeats; a replica that
// misses a batch fetches the origin's active requests on
// "<prefix>.active.<origin>". Dumps and replays arrive as numbered chunks
// ending with a final one. Core NATS delivers at most once: every loss is
// found by a sequence number and repaired as above.
//
// Dumps carry the index's blocks as RouterEvents too, but their Stored
// events name each block by its sequence hash (kvroute.Event.SeqHashes),
// not by the content hash a RouterEvent's tokens_hash means: the index
// keeps no content hashes. A dump chunk says so in a field of its own.
//
// Every message of the package's own is a msgpack array marked with its
// major wire version in a NATS header: the oldest version whose readers
// read it right, up to WireVersion. Readers skip the fields a newer
// version appended to a record, so replicas and relays of different
// versions work together during an upgrade; a message of a newer major
// version is dropped unread and counted (ReplicaStats.NewerWire). Dump
// chunks of sequence hashes are of version 2, every other message of
// version 1: a replica of version 1 takes everything from a newer one but
// its dumps, and so syncs from its relay's replay or from replicas of its
// own version until they are upgraded; a replica of version 2 takes the
// dumps of both (version 1's carry content hashes, which it hashes as
// its index's Hasher does).
package natsx
