package natsx

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/cputime"
)

// BenchmarkPublisherApply times the relay's path of one event: numbering,
// encoding, keeping it for replay and publishing it to an in-process
// server, over 8 workers whose buffers are full (each event drops the
// worker's oldest). On Linux it also reports cpu-ns/event, the process's
// CPU time per event (the server's share included), the cost of the work
// on a machine whose other processes inflate wall-clock time.
func BenchmarkPublisherApply(b *testing.B) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		b.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		b.Fatal("nats server did not start")
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	pub, err := NewPublisher(PublisherConfig{Conn: nc, ReplayEvents: 1024})
	if err != nil {
		b.Fatal(err)
	}
	const workers = 8
	evs := make([]kvroute.Event, workers)
	for i := range evs {
		evs[i] = kvroute.Event{Kind: kvroute.EventStored, Worker: kvroute.WorkerKey{ID: kvroute.WorkerID(i)},
			Blocks: []kvroute.StoredBlock{{External: 1, Hash: 2}, {External: 3, Hash: 4}}, HasParent: true, Parent: 9}
	}
	for i := range workers * 1024 { // fill every buffer
		if err := pub.Apply(&evs[i%workers]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, cpuOK := cputime.Process()
	for i := range b.N {
		if err := pub.Apply(&evs[i%workers]); err != nil {
			b.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	if cpu1, ok := cputime.Process(); cpuOK && ok {
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/event")
	}
}
