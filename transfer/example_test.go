package transfer_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/tcp"
)

// Two agents in one process: register memory, exchange metadata, READ a
// block with a notification, and receive the notification on the target.
func Example() {
	decode, err := tcp.New(tcp.Config{Name: "decode-0"})
	if err != nil {
		log.Fatal(err)
	}
	defer decode.Close()
	prefill, err := tcp.New(tcp.Config{Name: "prefill-0"})
	if err != nil {
		log.Fatal(err)
	}
	defer prefill.Close()

	dst, _ := transfer.AllocBuffer(1 << 16)
	defer dst.Free()
	src, _ := transfer.AllocBuffer(1 << 16)
	defer src.Free()
	copy(src.Bytes()[4096:], "the KV block")
	if err := decode.RegisterMem(dst.RegList()); err != nil {
		log.Fatal(err)
	}
	if err := prefill.RegisterMem(src.RegList()); err != nil {
		log.Fatal(err)
	}
	md, _ := prefill.LocalMetadata()
	name, err := decode.LoadRemoteMetadata(md)
	if err != nil {
		log.Fatal(err)
	}

	req, err := decode.CreateRequest(transfer.Read,
		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{dst.Desc(0, 12)}},
		transfer.DescList{Kind: transfer.DRAM, Descs: []transfer.Desc{src.Desc(4096, 12)}},
		name, &transfer.RequestOptions{Notif: []byte("req-42")})
	if err != nil {
		log.Fatal(err)
	}
	defer req.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := req.Post(); err != nil {
		log.Fatal(err)
	}
	if err := req.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	n, err := transfer.NewInbox(prefill).Wait(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("decode got %q; prefill notified by %s: %s\n", dst.Bytes()[:12], n.From, n.Msg)
	// Output: decode got "the KV block"; prefill notified by decode-0: req-42
}

// A layout maps block ids to the descriptors of every layer and plane.
func ExampleLayout() {
	l := transfer.Layout{
		Layers: 2, Blocks: 1024, BlockTokens: 16, KVHeads: 8, HeadDim: 128, DTypeSize: 2,
		Bases: []uintptr{0x7f0000000000},
	}
	if err := l.Validate(); err != nil {
		log.Fatal(err)
	}
	descs, _ := l.BlockDescs([]int{5})
	for _, d := range descs.Descs {
		fmt.Printf("%#x %d\n", d.Addr, d.Len)
	}
	fmt.Println(l.BlockBytes(), "bytes per block")
	// Output:
	// 0x7f0000050000 32768
	// 0x7f0000058000 32768
	// 0x7f0004050000 32768
	// 0x7f0004058000 32768
	// 131072 bytes per block
}

// A decode rank of a TP-8 worker reads its half of the heads of one TP-4
// prefill rank.
func ExampleMapBlocks() {
	decode := transfer.Layout{Layers: 1, Blocks: 64, BlockTokens: 16, KVHeads: 1, HeadDim: 128, DTypeSize: 2,
		TPSize: 8, TPRank: 5, Bases: []uintptr{0x100000}}
	ranks, _ := transfer.PeerRanks(&decode, 4)
	prefill := decode
	prefill.KVHeads, prefill.TPSize, prefill.TPRank, prefill.Bases = 2, 4, ranks[0], []uintptr{0x900000}
	hs, _ := transfer.Overlap(&decode, &prefill)
	local, remote, _ := transfer.MapBlocks(&decode, &prefill, []int{3}, []int{7})
	fmt.Println("read from prefill rank", ranks[0], "heads from", hs.Remote, "count", hs.Count)
	for i := range local.Descs {
		fmt.Printf("%#x <- %#x (%d bytes)\n", local.Descs[i].Addr, remote.Descs[i].Addr, local.Descs[i].Len)
	}
	// Output:
	// read from prefill rank 2 heads from 1 count 1
	// 0x106000 <- 0x91d000 (4096 bytes)
	// 0x107000 <- 0x91f000 (4096 bytes)
}

// The disaggregated handoff: a decode rank pulls the blocks the router's
// decision names from the prefill worker.
func ExamplePuller() {
	shape := transfer.Layout{Layers: 2, Blocks: 8, BlockTokens: 16, KVHeads: 2, HeadDim: 64, DTypeSize: 2}
	newRank := func(name string) (*tcp.Agent, *transfer.Buffer, transfer.Layout) {
		a, err := tcp.New(tcp.Config{Name: name})
		if err != nil {
			log.Fatal(err)
		}
		l := shape
		buf, _ := transfer.AllocBuffer(int(uint64(l.Blocks) * l.BlockBytes()))
		l.Bases = []uintptr{buf.Addr()}
		if err := a.RegisterMem(l.RegList()); err != nil {
			log.Fatal(err)
		}
		return a, buf, l
	}
	prefillW, decodeW := kvroute.WorkerKey{ID: 1}, kvroute.WorkerKey{ID: 2}
	pa, pbuf, pl := newRank("prefill-1")
	defer pa.Close()
	defer pbuf.Free()
	da, dbuf, dl := newRank("decode-2")
	defer da.Close()
	defer dbuf.Free()

	info, _ := transfer.NewPeerInfo(pa, prefillW, pl)
	wire, _ := info.MarshalBinary() // travels over the host's control plane
	var got transfer.PeerInfo
	if err := got.UnmarshalBinary(wire); err != nil {
		log.Fatal(err)
	}

	puller, _ := transfer.NewPuller(transfer.PullerConfig{Agent: da, Worker: decodeW, Layout: dl})
	defer puller.Close()
	if err := puller.AddPeer(got); err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := puller.Pull(ctx, transfer.PullRequest{
		Prefill: prefillW, Decode: decodeW,
		PrefillBlocks: []int{0, 1, 2}, DecodeBlocks: []int{5, 6, 7},
		Notif: []byte("req-7"),
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rep.Blocks, "blocks,", rep.Bytes, "bytes from", rep.Agents)
	// Output: 3 blocks, 49152 bytes from [prefill-1]
}
