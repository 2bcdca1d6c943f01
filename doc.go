// Package kvroute is the shared vocabulary of kvroute, an embeddable library
// for KV-cache-aware routing of LLM inference requests.
//
// It defines worker identities ([WorkerKey]), the hashes that name KV-cache
// blocks ([BlockHash], [SeqHash], [ExternalHash]), storage tiers ([Tier]), the
// token [Hasher] that is bit-identical to NVIDIA Dynamo's router, and the
// canonical KV-cache [Event] that every decoder produces and the indexer
// consumes. It imports no other kvroute package and does no I/O.
//
// # Usage
//
// A host that routes requests does three things with this package:
//
//  1. Build one [Hasher] per model with the engines' block size (and the
//     LoRA adapter name or cache namespace when they are used, and Eagle
//     for engines that run Eagle speculative decoding).
//  2. Hash each request's prompt with [Hasher.AppendSeqHashes] into a slice
//     it reuses, and ask the indexer which worker holds the longest prefix.
//     A request with a cache salt is hashed with [Hasher.WithSalt], one
//     with images or other multimodal items with
//     [Hasher.AppendSeqHashesMM], so that it never matches blocks of
//     another tenant or another image ([MMObject], [MMIdentifierHash]).
//  3. Feed the engines' KV events, converted to [Event] by package kvevents,
//     into the indexer.
//
// The sub-packages do the rest: indexer (the cluster prefix index),
// scheduling (cost functions, selector, load tracker, admission queue),
// router (the facade a gateway calls), kvevents (wire codecs and
// transports), transfer (NIXL-shaped KV block movement) and bench.
package kvroute
