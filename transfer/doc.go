// Package transfer moves KV-cache blocks between inference workers with the
// model of NVIDIA NIXL: agents, registered memory, metadata exchange and
// READ/WRITE requests over descriptor lists.
//
// In disaggregated serving a prefill worker computes a prompt's KV blocks
// and a decode worker pulls them; blocks also move between memory tiers.
// Engines do this with NIXL. This package gives a Go control plane the same
// vocabulary, so that it can register memory, exchange metadata and move
// blocks without leaving Go:
//
//   - [Agent] mirrors nixlAgent. Backends implement it: package
//     transfer/tcp (pure Go, over TCP, works everywhere) and package
//     transfer/nixl (the real NIXL, loaded at run time).
//   - [DescList], [RegList] and [Desc] mirror NIXL's descriptor lists;
//     [Buffer] is mmap-backed host memory to register, since backends keep
//     pointers to registered memory and Go heap memory must never be one.
//   - [Request] is a transfer: posted, polled ([Request.Status]), waited on
//     with a context ([Request.Wait]) and released.
//   - [Layout] maps KV block ids of one tensor-parallel rank to descriptors,
//     and [MapBlocks], [SliceLists] and [PeerRanks] map two ranks of
//     different tensor-parallel splits onto each other.
//   - [PeerInfo] is what a rank publishes (agent metadata and layout), and
//     [Puller] runs the prefill-to-decode handoff a router decided on.
//
// # Usage
//
// On each rank of each worker, the host:
//
//  1. Creates an agent (tcp.New or nixl.New) and registers the rank's KV
//     cache: agent.RegisterMem(layout.RegList()).
//  2. Publishes NewPeerInfo(agent, worker, layout), encoded with
//     PeerInfo.MarshalBinary, on its control plane.
//
// On each decode rank it also:
//
//  3. Creates a Puller and calls Puller.AddPeer with the PeerInfo of every
//     prefill rank (again when a prefill rank restarts).
//  4. For each request the router sent to a (prefill, decode) pair, calls
//     Puller.Pull with both workers and the block ids, after prefill
//     finished. Pull returns when the blocks landed.
//
// And on each prefill rank:
//
//  5. Polls an Inbox for the notification Pull sends (the request id) and
//     frees the request's blocks when it arrives.
//
// A complete two-agent transfer:
//
//	a, _ := tcp.New(tcp.Config{Name: "decode-0"})
//	b, _ := tcp.New(tcp.Config{Name: "prefill-0"})
//	bufA, _ := transfer.AllocBuffer(1 << 20)
//	bufB, _ := transfer.AllocBuffer(1 << 20)
//	_ = a.RegisterMem(bufA.RegList())
//	_ = b.RegisterMem(bufB.RegList())
//	md, _ := b.LocalMetadata()
//	_, _ = a.LoadRemoteMetadata(md)
//	req, _ := a.CreateRequest(transfer.Read,
//		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{bufA.Desc(0, 4096)}},
//		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{bufB.Desc(8192, 4096)}},
//		"prefill-0", &transfer.RequestOptions{Notif: []byte("req-42")})
//	_, _ = req.Post()
//	err := req.Wait(ctx)
//	_ = req.Release()
//
// # Concurrency
//
// Agents, requests, prepared lists, Inbox and Puller are safe for
// concurrent use. Layout and PeerInfo are plain values.
//
// # Errors
//
// Every error wraps one of the package's sentinels (ErrNotRegistered,
// ErrUnknownAgent, ErrRemoteDisconnect, ...), usually inside an *Error that
// names the operation and agents. Releasing twice and using a closed agent
// are errors (ErrReleased, ErrClosed), never crashes. Backends treat what
// peers send as untrusted input: malformed frames or metadata are errors.
package transfer
