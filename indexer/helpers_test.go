package indexer_test

import (
	"github.com/kvroute/kvroute"
)

var testHasher = kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})

func wk(id uint64) kvroute.WorkerKey { return kvroute.WorkerKey{ID: kvroute.WorkerID(id)} }

// prompt returns n blocks of tokens whose content is derived from base, so
// that prompts with equal bases share their blocks.
func prompt(bases ...uint32) []uint32 {
	var toks []uint32
	for _, b := range bases {
		for j := uint32(0); j < 4; j++ {
			toks = append(toks, b*4+j)
		}
	}
	return toks
}

// stored builds a Stored event for the blocks of tokens, with engine hashes
// ext (one per block) under parent (0 = root).
func stored(w kvroute.WorkerKey, id uint64, tier kvroute.Tier, parent kvroute.ExternalHash, ext []kvroute.ExternalHash, tokens []uint32) *kvroute.Event {
	locals := testHasher.AppendBlockHashes(nil, tokens)
	ev := &kvroute.Event{Kind: kvroute.EventStored, Worker: w, ID: id, Tier: tier, HasParent: parent != 0, Parent: parent}
	for i, l := range locals {
		ev.Blocks = append(ev.Blocks, kvroute.StoredBlock{External: ext[i], Hash: l})
	}
	return ev
}

func removed(w kvroute.WorkerKey, id uint64, tier kvroute.Tier, ext ...kvroute.ExternalHash) *kvroute.Event {
	return &kvroute.Event{Kind: kvroute.EventRemoved, Worker: w, ID: id, Tier: tier, Removed: ext}
}

func cleared(w kvroute.WorkerKey, id uint64) *kvroute.Event {
	return &kvroute.Event{Kind: kvroute.EventCleared, Worker: w, ID: id}
}

func seqsOf(tokens []uint32) []kvroute.SeqHash { return testHasher.AppendSeqHashes(nil, tokens) }
