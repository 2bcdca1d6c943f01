// Package transfertest checks that a transfer backend behaves like NIXL.
//
// # Usage
//
// A backend's tests call TestAgent with a Factory that creates a fresh
// agent of that backend, the way golang.org/x/net/nettest.TestConn checks
// a net.Conn:
//
//	func TestConformance(t *testing.T) {
//		transfertest.TestAgent(t, func(t testing.TB, name string) transfer.Agent {
//			a, err := tcp.New(tcp.Config{Name: name})
//			if err != nil {
//				t.Fatal(err)
//			}
//			return a
//		})
//	}
//
// The suite builds pairs of agents in one process, exchanges their
// metadata, moves scattered blocks with WRITE and READ (one-shot and
// prepared lists), checks every byte, exchanges notifications, and expects
// typed errors for unregistered memory, unknown agents, out-of-range
// indices, double releases, closed agents and a closed peer. It closes the
// agents it creates.
//
// Benchmark measures the same backends: throughput of 1,000 blocks of
// 64 KiB and the per-request overhead of small blocks.
package transfertest
