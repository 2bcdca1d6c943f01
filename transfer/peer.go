package transfer

import (
	"encoding/json"
	"fmt"

	"github.com/kvroute/kvroute"
)

// peerInfoVersion is the version of PeerInfo's encoding.
const peerInfoVersion = 1

// PeerInfo is what one rank of a worker publishes so that others can move
// its KV blocks: the worker it belongs to, its agent's name and metadata,
// and the layout of its KV cache. Hosts carry it over their own control
// plane (the way vLLM's handshake carries NixlAgentMetadata).
type PeerInfo struct {
	// Worker is the worker (and data-parallel rank) the agent serves.
	Worker kvroute.WorkerKey
	// Agent is the agent's name.
	Agent string
	// Metadata is the agent's Agent.LocalMetadata, taken after it
	// registered the layout's memory.
	Metadata []byte
	// Layout is the rank's KV cache layout; its TPRank and TPSize place it
	// in the worker's tensor-parallel group.
	Layout Layout
}

// NewPeerInfo describes agent a, serving worker w with layout l.
func NewPeerInfo(a Agent, w kvroute.WorkerKey, l Layout) (PeerInfo, error) {
	if err := l.Validate(); err != nil {
		return PeerInfo{}, err
	}
	md, err := a.LocalMetadata()
	if err != nil {
		return PeerInfo{}, err
	}
	return PeerInfo{Worker: w, Agent: a.Name(), Metadata: md, Layout: l}, nil
}

// peerInfoWire is PeerInfo's JSON form.
type peerInfoWire struct {
	Version  int    `json:"v"`
	WorkerID uint64 `json:"worker"`
	DPRank   uint32 `json:"dp_rank"`
	Agent    string `json:"agent"`
	Metadata []byte `json:"metadata"`
	Layout   Layout `json:"layout"`
}

// MarshalBinary encodes p as versioned JSON.
func (p PeerInfo) MarshalBinary() ([]byte, error) {
	return json.Marshal(peerInfoWire{
		Version: peerInfoVersion, WorkerID: uint64(p.Worker.ID), DPRank: uint32(p.Worker.Rank),
		Agent: p.Agent, Metadata: p.Metadata, Layout: p.Layout,
	})
}

// UnmarshalBinary decodes what MarshalBinary produced and validates the
// layout. Errors wrap ErrBadMetadata.
func (p *PeerInfo) UnmarshalBinary(b []byte) error {
	var w peerInfoWire
	if err := json.Unmarshal(b, &w); err != nil {
		return fmt.Errorf("%w: peer info: %w", ErrBadMetadata, err)
	}
	if w.Version != peerInfoVersion {
		return fmt.Errorf("%w: peer info version %d, want %d", ErrBadMetadata, w.Version, peerInfoVersion)
	}
	if w.Agent == "" || len(w.Metadata) == 0 {
		return fmt.Errorf("%w: peer info without agent or metadata", ErrBadMetadata)
	}
	if err := w.Layout.Validate(); err != nil {
		return fmt.Errorf("%w: peer info: %w", ErrBadMetadata, err)
	}
	*p = PeerInfo{
		Worker:   kvroute.WorkerKey{ID: kvroute.WorkerID(w.WorkerID), Rank: kvroute.DPRank(w.DPRank)},
		Agent:    w.Agent,
		Metadata: w.Metadata,
		Layout:   w.Layout,
	}
	return nil
}
