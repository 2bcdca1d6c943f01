package main

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute"
)

// hashConfig shapes the hashing workload: Prompts random prompts of Tokens
// token ids, hashed Repeat times each into chained sequence hashes of
// 16-token blocks.
type hashConfig struct {
	Prompts, Tokens, Repeat int
	Seed                    uint64
}

func defaultHash() hashConfig { return hashConfig{Prompts: 64, Tokens: 4096, Repeat: 300, Seed: 3} }

// secHash is the hashing workload's only section.
const secHash = "hash"

// genHash builds the hashing workload. The expected digest comes from block
// hashes chained with kvroute.ChainSeqHashes, a different path through the
// code than the Hasher.AppendSeqHashes call the kvroute side times.
func genHash(c hashConfig) *workload {
	rng := rand.New(rand.NewPCG(c.Seed, 0x4a54))
	h := kvroute.MustHasher(kvroute.HasherConfig{})
	ops := make([]op, c.Prompts)
	for i := range ops {
		tokens := make([]uint32, c.Tokens)
		for j := range tokens {
			tokens[j] = rng.Uint32N(152064) // a Qwen-sized vocabulary
		}
		seqs := kvroute.ChainSeqHashes(nil, 0, false, h.AppendBlockHashes(nil, tokens))
		ops[i] = op{Kind: opHash, Tokens: tokens, WantDigest: seqDigest(seqs)}
	}
	return &workload{
		BlockSize: h.BlockSize(),
		Sections:  []section{{Name: secHash, Timed: true, Metric: perOp, Repeat: c.Repeat, Ops: ops}},
	}
}
