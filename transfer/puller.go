package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
)

// PullerConfig configures a Puller. Agent, Worker and Layout are required.
type PullerConfig struct {
	// Agent is the decode rank's agent, with Layout's memory registered.
	Agent Agent
	// Worker is the decode worker this rank belongs to.
	Worker kvroute.WorkerKey
	// Layout is this rank's KV cache layout.
	Layout Layout
	// MaxPeerDescs bounds a prefill rank's descriptor count (its layout's
	// NumDescs) that AddPeer accepts, since the descriptor lists it
	// prepares grow with the remote's block count, which comes from the
	// network. Zero means DefaultMaxPeerDescs(Layout); negative means no
	// bound beyond Layout.Validate's.
	MaxPeerDescs int
	// Clock times the pulls for PullReport. Nil means the system clock.
	Clock kvroute.Clock
	// Logger receives per-pull diagnostics. Nil means discard.
	Logger *slog.Logger
}

// Puller runs the disaggregated-serving handoff on a decode rank: when the
// router has chosen a prefill worker and a decode worker for a request, the
// decode rank pulls the prompt's KV blocks from every rank of the prefill
// worker that holds some of its heads, with one READ per prefill rank over
// descriptor lists prepared once per peer (as vLLM and Dynamo do with NIXL).
// The prefill ranks get the request's notification when the data has
// landed and can free their blocks.
//
// Methods are safe for concurrent use. Pulls run concurrently with each
// other; AddPeer and RemovePeer wait for running pulls.
type Puller struct {
	cfg   PullerConfig
	clock kvroute.Clock
	log   *slog.Logger

	mu sync.RWMutex // protects peers and closed; read-held by Pull
	// peers maps a prefill agent's name to its prepared lists.
	peers  map[string]*pullPeer
	closed bool
}

// pullPeer is one prefill rank known to a Puller.
type pullPeer struct {
	info PeerInfo
	// slice is the heads shared with the local rank; ok is false when
	// there are none (the peer is kept, but never read from).
	slice HeadSlice
	ok    bool
	// local and remote are the prepared slice lists (nil when !ok).
	local, remote PreppedList
}

// PullRequest asks for the KV blocks of one request.
type PullRequest struct {
	// Prefill is the worker that computed the blocks; Decode is the worker
	// that receives them and must be the Puller's.
	Prefill, Decode kvroute.WorkerKey
	// PrefillAgents, when set, restricts the pull to these agents of the
	// prefill worker. Empty means every known rank of Prefill.
	PrefillAgents []string
	// PrefillBlocks[i] is copied into DecodeBlocks[i].
	PrefillBlocks, DecodeBlocks []int
	// Notif is sent to each prefill rank once its part landed. Nil sends
	// none.
	Notif []byte
}

// PullReport describes a finished pull.
type PullReport struct {
	Prefill, Decode kvroute.WorkerKey
	// Agents are the prefill agents read from, sorted.
	Agents []string
	// Blocks is the number of blocks moved; Bytes the bytes read.
	Blocks int
	Bytes  uint64
	// Started and Finished are the Clock's times around the pull.
	Started, Finished time.Time
}

// DefaultMaxPeerDescs returns the default PullerConfig.MaxPeerDescs for a
// local layout: 8 times its own descriptor count (prefill workers may hold
// more blocks than decode workers), and at least 1<<20.
func DefaultMaxPeerDescs(local *Layout) int {
	return max(8*local.NumDescs(), 1<<20)
}

// NewPuller returns a Puller. Errors wrap ErrInvalidParam.
func NewPuller(cfg PullerConfig) (*Puller, error) {
	if cfg.Agent == nil {
		return nil, fmt.Errorf("%w: puller without agent", ErrInvalidParam)
	}
	if err := cfg.Layout.Validate(); err != nil {
		return nil, err
	}
	cfg.Layout.Bases = slices.Clone(cfg.Layout.Bases)
	if cfg.MaxPeerDescs == 0 {
		cfg.MaxPeerDescs = DefaultMaxPeerDescs(&cfg.Layout)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Puller{cfg: cfg, clock: kvroute.ClockOrSystem(cfg.Clock), log: log, peers: map[string]*pullPeer{}}, nil
}

// AddPeer loads a prefill rank's metadata and prepares the descriptor
// lists of the heads it shares with this rank. Adding an agent again
// replaces it. When AddPeer fails after the agent loaded the metadata, it
// unloads it again, unless the metadata names a peer the Puller holds
// already. Errors: ErrMismatch (incompatible layouts, or metadata of
// another agent, or a layout of more than PullerConfig.MaxPeerDescs
// descriptors), the agent's errors.
func (p *Puller) AddPeer(info PeerInfo) error {
	local := &p.cfg.Layout
	if err := info.Layout.Validate(); err != nil {
		return err
	}
	if n := info.Layout.NumDescs(); p.cfg.MaxPeerDescs > 0 && n > p.cfg.MaxPeerDescs {
		return fmt.Errorf("%w: peer %q has %d descriptors, above the bound of %d", ErrMismatch, info.Agent, n, p.cfg.MaxPeerDescs)
	}
	if err := Compatible(local, &info.Layout); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("transfer: puller: %w", ErrClosed)
	}
	name, err := p.cfg.Agent.LoadRemoteMetadata(info.Metadata)
	if err != nil {
		return err
	}
	peer, err := p.prepPeer(info, name)
	if err != nil {
		// The agent keeps no peer the puller does not know. A peer the
		// puller holds already keeps the metadata just loaded: its
		// transfers need the agent to know it.
		if p.peers[name] == nil {
			if uerr := p.cfg.Agent.InvalidateRemoteMetadata(name); uerr != nil {
				return errors.Join(err, fmt.Errorf("transfer: puller: unload metadata of %q: %w", name, uerr))
			}
		}
		return err
	}
	if old := p.peers[info.Agent]; old != nil {
		old.release()
	}
	p.peers[info.Agent] = peer
	return nil
}

// prepPeer checks that the metadata the agent loaded under name is info's
// agent and prepares the lists of the heads info's rank shares with this
// one.
func (p *Puller) prepPeer(info PeerInfo, name string) (*pullPeer, error) {
	if name != info.Agent {
		return nil, fmt.Errorf("%w: peer info names agent %q, its metadata %q", ErrMismatch, info.Agent, name)
	}
	local := &p.cfg.Layout
	peer := &pullPeer{info: info}
	peer.slice, peer.ok = Overlap(local, &info.Layout)
	if !peer.ok {
		return peer, nil
	}
	ld, rd, err := SliceLists(local, &info.Layout)
	if err != nil {
		return nil, err
	}
	if peer.local, err = p.cfg.Agent.PrepDescList("", ld); err != nil {
		return nil, err
	}
	if peer.remote, err = p.cfg.Agent.PrepDescList(info.Agent, rd); err != nil {
		_ = peer.local.Release()
		return nil, err
	}
	return peer, nil
}

func (pp *pullPeer) release() {
	if pp.local != nil {
		_ = pp.local.Release()
		_ = pp.remote.Release()
	}
}

// RemovePeer forgets a prefill agent and invalidates its metadata.
// Errors: ErrUnknownAgent.
func (p *Puller) RemovePeer(agent string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	peer := p.peers[agent]
	if peer == nil {
		return fmt.Errorf("transfer: puller: %w: %q", ErrUnknownAgent, agent)
	}
	delete(p.peers, agent)
	peer.release()
	return p.cfg.Agent.InvalidateRemoteMetadata(agent)
}

// Close releases the prepared lists. It does not close the agent.
func (p *Puller) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("transfer: puller: %w", ErrClosed)
	}
	p.closed = true
	for _, peer := range p.peers {
		peer.release()
	}
	p.peers = nil
	return nil
}

// sources returns the peers to read from for req, checking that together
// they hold every head of the local rank. The caller holds mu.
func (p *Puller) sources(req *PullRequest) ([]*pullPeer, error) {
	var out []*pullPeer
	for _, peer := range p.peers {
		if peer.info.Worker != req.Prefill || !peer.ok {
			continue
		}
		if len(req.PrefillAgents) > 0 && !slices.Contains(req.PrefillAgents, peer.info.Agent) {
			continue
		}
		out = append(out, peer)
	}
	slices.SortFunc(out, func(a, b *pullPeer) int { return a.slice.Local - b.slice.Local })
	next := 0
	for _, peer := range out {
		if peer.slice.Local > next {
			break
		}
		next = max(next, peer.slice.Local+peer.slice.Count)
	}
	if next < p.cfg.Layout.KVHeads {
		return nil, fmt.Errorf("%w: known ranks of prefill worker %s hold heads 0..%d of this rank's %d",
			ErrMismatch, req.Prefill, next, p.cfg.Layout.KVHeads)
	}
	// Read overlapping slices once: keep the first peer for each head.
	var picked []*pullPeer
	covered := 0
	for _, peer := range out {
		if peer.slice.Local+peer.slice.Count > covered {
			picked = append(picked, peer)
			covered = peer.slice.Local + peer.slice.Count
		}
	}
	return picked, nil
}

// Pull moves the request's blocks from the prefill worker's ranks into
// this rank's memory and returns once every byte landed, or the first error.
// Errors: ErrMismatch (wrong decode worker, prefill ranks missing),
// ErrInvalidParam, ErrOutOfRange (block ids), the agent's transfer errors,
// ctx's error. After an error the destination blocks hold partial data.
func (p *Puller) Pull(ctx context.Context, req PullRequest) (PullReport, error) {
	rep := PullReport{Prefill: req.Prefill, Decode: req.Decode, Blocks: len(req.DecodeBlocks), Started: p.clock.Now()}
	if req.Decode != p.cfg.Worker {
		return rep, fmt.Errorf("%w: pull for decode worker %s on a puller of %s", ErrMismatch, req.Decode, p.cfg.Worker)
	}
	if len(req.PrefillBlocks) != len(req.DecodeBlocks) || len(req.DecodeBlocks) == 0 {
		return rep, fmt.Errorf("%w: %d prefill blocks for %d decode blocks", ErrInvalidParam, len(req.PrefillBlocks), len(req.DecodeBlocks))
	}
	local := &p.cfg.Layout
	li, err := local.AppendIndices(nil, req.DecodeBlocks)
	if err != nil {
		return rep, err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return rep, fmt.Errorf("transfer: puller: %w", ErrClosed)
	}
	peers, err := p.sources(&req)
	if err != nil {
		return rep, err
	}
	var opts *RequestOptions
	if req.Notif != nil {
		opts = &RequestOptions{Notif: req.Notif}
	}
	reqs := make([]Request, 0, len(peers))
	defer func() {
		for _, r := range reqs {
			_ = r.Release()
		}
	}()
	for _, peer := range peers {
		ri, err := peer.info.Layout.AppendIndices(nil, req.PrefillBlocks)
		if err != nil {
			return rep, err
		}
		r, err := p.cfg.Agent.MakeRequest(Read, peer.local, li, peer.remote, ri, opts)
		if err != nil {
			return rep, err
		}
		reqs = append(reqs, r)
		if _, err := r.Post(); err != nil {
			return rep, err
		}
		rep.Agents = append(rep.Agents, peer.info.Agent)
		rep.Bytes += uint64(len(li)) * uint64(peer.slice.Count) * local.HeadBytes()
	}
	var errs []error
	for _, r := range reqs {
		if err := r.Wait(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	rep.Finished = p.clock.Now()
	slices.Sort(rep.Agents)
	if err := errors.Join(errs...); err != nil {
		return rep, fmt.Errorf("transfer: pull from %s: %w", req.Prefill, err)
	}
	p.log.Debug("pulled", "prefill", req.Prefill, "blocks", rep.Blocks, "bytes", rep.Bytes, "agents", rep.Agents)
	return rep, nil
}
