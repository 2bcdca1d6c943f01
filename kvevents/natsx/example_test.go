package natsx_test

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/kvevents/natsx"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// A relay publishes an event; a router replica applies it to its index.
func Example() {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		panic(err)
	}
	go srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		panic("nats server did not start")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()

	// The router replica: index and tracker shared by the router and the
	// Replica, which is the router's LoadSync.
	index, _ := indexer.New(indexer.Config{})
	tracker, _ := scheduling.NewTracker(scheduling.TrackerConfig{})
	var r *router.Router
	rep, err := natsx.NewReplica(natsx.ReplicaConfig{Conn: nc, ID: "router-1", Index: index, Tracker: tracker,
		OnPeerLoad: func() { r.LoadChanged() }})
	if err != nil {
		panic(err)
	}
	// A worker removed and added again within RemoveGrace keeps its
	// blocks: the relay goes on publishing its events meanwhile.
	r, err = router.New(router.Config{Index: index, LoadTracker: tracker, LoadSync: rep, RemoveGrace: 5 * time.Minute})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- rep.Run(ctx) }()
	<-rep.Ready()

	// The relay: a Publisher (the Sink of the engine's event subscriber).
	pub, _ := natsx.NewPublisher(natsx.PublisherConfig{Conn: nc})
	go func() { _ = pub.Serve(ctx) }()
	w := kvroute.WorkerKey{ID: 7}
	_ = pub.Apply(&kvroute.Event{Kind: kvroute.EventStored, Worker: w, ID: 1,
		Blocks: []kvroute.StoredBlock{{External: 1, Hash: 42}}})
	for len(index.AppendWorkerBlocks(w, nil)) == 0 {
		time.Sleep(time.Millisecond)
	}
	last, _ := index.LastEventID(w)
	fmt.Println("blocks:", len(index.AppendWorkerBlocks(w, nil)), "last event:", last)
	cancel()
	fmt.Println(<-done)
	// Output:
	// blocks: 1 last event: 1
	// <nil>
}
