package transfer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/tcp"
)

// stepClock advances one second per reading.
type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

// agentRank is a rank with a TCP agent that registered its memory.
type agentRank struct {
	*rank
	agent *tcp.Agent
	info  transfer.PeerInfo
}

func newAgentRank(t *testing.T, worker kvroute.WorkerKey, tp, r int, st style) *agentRank {
	t.Helper()
	rk := newRank(t, tp, r, st)
	a, err := tcp.New(tcp.Config{Name: fmt.Sprintf("w%d-tp%d-r%d", worker.ID, tp, r)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	require.NoError(t, a.RegisterMem(rk.layout.RegList()))
	info, err := transfer.NewPeerInfo(a, worker, rk.layout)
	require.NoError(t, err)
	// Peer info travels as bytes over the host's control plane.
	wire, err := info.MarshalBinary()
	require.NoError(t, err)
	var got transfer.PeerInfo
	require.NoError(t, got.UnmarshalBinary(wire))
	require.Equal(t, info, got)
	return &agentRank{rank: rk, agent: a, info: got}
}

// TestPullerTP runs the disaggregated handoff between workers with
// different tensor-parallel sizes over the TCP backend and checks every
// byte each decode rank receives, and the notifications the prefill ranks
// get.
func TestPullerTP(t *testing.T) {
	prefillW := kvroute.WorkerKey{ID: 1}
	decodeW := kvroute.WorkerKey{ID: 2, Rank: 1}
	src, dst := []int{5, 1, 3}, []int{0, 4, 2}
	for _, tc := range []struct{ prefillTP, decodeTP int }{{4, 8}, {8, 4}, {2, 2}} {
		t.Run(fmt.Sprintf("prefill_tp%d_decode_tp%d", tc.prefillTP, tc.decodeTP), func(t *testing.T) {
			prefill := make([]*agentRank, tc.prefillTP)
			for r := range prefill {
				prefill[r] = newAgentRank(t, prefillW, tc.prefillTP, r, style(r%3))
				prefill[r].fillModel()
			}
			inboxes := make([]*transfer.Inbox, len(prefill))
			for i, p := range prefill {
				inboxes[i] = transfer.NewInbox(p.agent)
			}
			for d := range tc.decodeTP {
				dec := newAgentRank(t, decodeW, tc.decodeTP, d, style((d+2)%3))
				puller, err := transfer.NewPuller(transfer.PullerConfig{
					Agent: dec.agent, Worker: decodeW, Layout: dec.layout, Clock: &stepClock{},
				})
				require.NoError(t, err)
				for _, p := range prefill {
					require.NoError(t, puller.AddPeer(p.info))
				}
				notif := []byte(fmt.Sprintf("req-%d", d))
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				rep, err := puller.Pull(ctx, transfer.PullRequest{
					Prefill: prefillW, Decode: decodeW, PrefillBlocks: src, DecodeBlocks: dst, Notif: notif,
				})
				cancel()
				require.NoError(t, err)
				dec.check(t, dst, src)

				ranks, err := transfer.PeerRanks(&dec.layout, tc.prefillTP)
				require.NoError(t, err)
				require.Len(t, rep.Agents, len(ranks))
				require.Equal(t, len(dst), rep.Blocks)
				require.Equal(t, uint64(len(dst))*dec.layout.BlockBytes(), rep.Bytes)
				require.Equal(t, time.Second, rep.Finished.Sub(rep.Started))
				for _, r := range ranks {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					_, err := inboxes[r].Wait(ctx, transfer.From(dec.agent.Name(), notif))
					cancel()
					require.NoError(t, err, "prefill rank %d notification", r)
				}
				require.NoError(t, puller.Close())
			}
		})
	}
}

func TestPullerErrors(t *testing.T) {
	prefillW, decodeW := kvroute.WorkerKey{ID: 1}, kvroute.WorkerKey{ID: 2}
	p0 := newAgentRank(t, prefillW, 2, 0, contiguousHND)
	p1 := newAgentRank(t, prefillW, 2, 1, contiguousHND)
	p0.fillModel()
	p1.fillModel()
	dec := newAgentRank(t, decodeW, 1, 0, contiguousHND)
	puller, err := transfer.NewPuller(transfer.PullerConfig{Agent: dec.agent, Worker: decodeW, Layout: dec.layout})
	require.NoError(t, err)
	defer func() { _ = puller.Close() }()
	require.NoError(t, puller.AddPeer(p0.info))
	ctx := context.Background()
	req := transfer.PullRequest{Prefill: prefillW, Decode: decodeW, PrefillBlocks: []int{0}, DecodeBlocks: []int{1}}

	_, err = puller.Pull(ctx, req)
	require.ErrorIs(t, err, transfer.ErrMismatch, "half of the heads are missing")
	require.NoError(t, puller.AddPeer(p1.info))
	_, err = puller.Pull(ctx, req)
	require.NoError(t, err)
	dec.check(t, []int{1}, []int{0})

	wrong := req
	wrong.Decode = prefillW
	_, err = puller.Pull(ctx, wrong)
	require.ErrorIs(t, err, transfer.ErrMismatch, "pull for another decode worker")
	wrong = req
	wrong.DecodeBlocks = []int{1, 2}
	_, err = puller.Pull(ctx, wrong)
	require.ErrorIs(t, err, transfer.ErrInvalidParam)
	wrong = req
	wrong.PrefillBlocks = []int{tBlocks}
	_, err = puller.Pull(ctx, wrong)
	require.ErrorIs(t, err, transfer.ErrOutOfRange)

	renamed := p1.info
	renamed.Agent = "someone-else"
	require.ErrorIs(t, puller.AddPeer(renamed), transfer.ErrMismatch)
	other := p1.info
	other.Layout.HeadDim *= 2
	require.ErrorIs(t, puller.AddPeer(other), transfer.ErrMismatch)

	// A layout far larger than the local one is refused before its
	// descriptor lists are built.
	huge := p1.info
	huge.Layout.Blocks = 1 << 24
	require.NoError(t, huge.Layout.Validate())
	err = puller.AddPeer(huge)
	require.ErrorIs(t, err, transfer.ErrMismatch)
	require.ErrorContains(t, err, "above the bound")
	bounded, err := transfer.NewPuller(transfer.PullerConfig{Agent: dec.agent, Worker: decodeW, Layout: dec.layout,
		MaxPeerDescs: p1.info.Layout.NumDescs() - 1})
	require.NoError(t, err)
	require.ErrorIs(t, bounded.AddPeer(p1.info), transfer.ErrMismatch)
	require.NoError(t, bounded.Close())

	require.NoError(t, puller.RemovePeer(p1.info.Agent))
	require.ErrorIs(t, puller.RemovePeer(p1.info.Agent), transfer.ErrUnknownAgent)
	_, err = puller.Pull(ctx, req)
	require.ErrorIs(t, err, transfer.ErrMismatch)

	// A prefill rank that went away fails the pull; nothing reports done.
	require.NoError(t, puller.AddPeer(p1.info))
	require.NoError(t, p1.agent.Close())
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = puller.Pull(cctx, req)
	require.ErrorIs(t, err, transfer.ErrRemoteDisconnect)
}

// TestAddPeerUnloadsOnFailure checks that an AddPeer failing after the
// agent loaded the peer's metadata leaves the agent without it, so that the
// agent holds no peer the Puller does not know.
func TestAddPeerUnloadsOnFailure(t *testing.T) {
	prefillW, decodeW := kvroute.WorkerKey{ID: 1}, kvroute.WorkerKey{ID: 2}
	p0 := newAgentRank(t, prefillW, 1, 0, contiguousHND)

	// bare is an agent that registered no memory, with a PeerInfo naming
	// p0's layout: its metadata loads, but no list over it can be prepared.
	bare, err := tcp.New(tcp.Config{Name: "bare"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = bare.Close() })
	bareInfo, err := transfer.NewPeerInfo(bare, prefillW, p0.layout)
	require.NoError(t, err)
	renamed := p0.info
	renamed.Agent = "someone-else"

	for _, tc := range []struct {
		name string
		// unregistered makes the decode agent register no memory of its
		// own, so the local list cannot be prepared.
		unregistered bool
		info         transfer.PeerInfo
		want         error
		// loaded is the agent the failed AddPeer loaded metadata of.
		loaded string
	}{
		{name: "metadata of another agent", info: renamed, want: transfer.ErrMismatch, loaded: p0.agent.Name()},
		{name: "remote memory not registered", info: bareInfo, want: transfer.ErrNotRegistered, loaded: bare.Name()},
		{name: "local memory not registered", unregistered: true, info: p0.info, want: transfer.ErrNotRegistered, loaded: p0.agent.Name()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rk := newRank(t, 1, 0, contiguousHND)
			dec, err := tcp.New(tcp.Config{Name: "decode"})
			require.NoError(t, err)
			t.Cleanup(func() { _ = dec.Close() })
			if !tc.unregistered {
				require.NoError(t, dec.RegisterMem(rk.layout.RegList()))
			}
			puller, err := transfer.NewPuller(transfer.PullerConfig{Agent: dec, Worker: decodeW, Layout: rk.layout})
			require.NoError(t, err)
			t.Cleanup(func() { _ = puller.Close() })

			require.ErrorIs(t, puller.AddPeer(tc.info), tc.want)
			require.ErrorIs(t, dec.InvalidateRemoteMetadata(tc.loaded), transfer.ErrUnknownAgent,
				"the agent still holds the metadata of %q", tc.loaded)
		})
	}

	// A failed AddPeer whose metadata names a peer the Puller holds keeps
	// that peer working.
	dec := newAgentRank(t, decodeW, 1, 0, contiguousHND)
	p0.fillModel()
	puller, err := transfer.NewPuller(transfer.PullerConfig{Agent: dec.agent, Worker: decodeW, Layout: dec.layout})
	require.NoError(t, err)
	defer func() { require.NoError(t, puller.Close()) }()
	require.NoError(t, puller.AddPeer(p0.info))
	require.ErrorIs(t, puller.AddPeer(renamed), transfer.ErrMismatch)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = puller.Pull(ctx, transfer.PullRequest{Prefill: prefillW, Decode: decodeW, PrefillBlocks: []int{2}, DecodeBlocks: []int{3}})
	require.NoError(t, err)
	dec.check(t, []int{3}, []int{2})
}

func TestPeerInfoUnmarshalErrors(t *testing.T) {
	for _, in := range []string{
		``, `{`, `{"v":2,"agent":"a","metadata":"AA=="}`,
		`{"v":1,"agent":"","metadata":"AA=="}`,
		`{"v":1,"agent":"a","metadata":"AA==","layout":{"layers":0}}`,
	} {
		var p transfer.PeerInfo
		require.ErrorIs(t, p.UnmarshalBinary([]byte(in)), transfer.ErrBadMetadata, in)
	}
}
