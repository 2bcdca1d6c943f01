// Package tcp is a pure-Go transfer backend that moves registered host
// memory between agents over TCP.
//
// It implements transfer.Agent with the semantics of NIXL's UCX backend for
// DRAM: memory registration, metadata exchange (name, address, registered
// regions), READ and WRITE of scattered descriptors, prepared descriptor
// lists addressed by index, notifications delivered only after the data
// landed, concurrent requests and clean errors when a peer disappears. It
// needs nothing beyond Go, so it is the backend CI always tests and the
// default for hosts without NIXL.
//
// # Usage
//
//  1. Create an agent per rank with New; Config.ListenAddr is the address
//     peers dial (loopback by default), Config.AdvertiseAddr what the
//     metadata tells them when it differs (NAT, containers).
//  2. Register memory outside the Go heap (transfer.Buffer, or memory from
//     C) with RegisterMem.
//  3. Exchange LocalMetadata bytes with peers over the host's control plane
//     and LoadRemoteMetadata them.
//  4. Create, Post, Wait and Release requests; take notifications with
//     Notifs (or a transfer.Inbox).
//  5. Close the agent.
//
// For example:
//
//	a, err := tcp.New(tcp.Config{Name: "decode-0", ListenAddr: "10.0.0.5:0"})
//	if err != nil {
//		return err
//	}
//	defer a.Close()
//
// # Protocol
//
// An initiator opens one connection per remote agent, on first use, and
// sends requests in order; a target serves each connection on its own
// goroutine. The connection's hello names the target and the incarnation
// (drawn at random when an agent starts) its metadata gave, so an agent
// restarted at the same name and address refuses initiators holding the
// old agent's metadata instead of serving its own memory for the old
// agent's. A WRITE frame carries its descriptors, notification and data;
// the target checks every descriptor against its registered memory before
// a byte moves, reads the data into place, then queues the notification
// and acknowledges. A READ frame carries descriptors; the target answers
// with the data, and once it landed the initiator sends the notification
// before it reports the request done. Connections are not authenticated or
// encrypted: run agents where only trusted peers reach them.
package tcp
