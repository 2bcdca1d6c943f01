package epp

import "sync/atomic"

// Stats counts what a Server did, plain data. All counts only grow.
type Stats struct {
	Streams     uint64 // ext_proc streams (HTTP requests) seen
	Routed      uint64 // requests given endpoints
	BadRequests uint64 // answered 400 (body not parseable) or 413 (too large)
	Unavailable uint64 // answered 503: no eligible endpoint (or none in the subset)
	Shed        uint64 // answered 429: every endpoint busy or the queue full
	// TokenizeErrors counts requests whose prompt could not be tokenized;
	// they are routed by load alone.
	TokenizeErrors uint64
	// ServedElsewhere counts requests that Envoy served on a fallback
	// endpoint rather than the one picked first.
	ServedElsewhere uint64
	Completed       uint64 // responses that reached their end
	EngineErrors    uint64 // responses with status 429 or 5xx
	Canceled        uint64 // streams that ended before their response did
	// PredictedCachedTokens and PredictedCachedBlocks add up the prefix
	// the index predicted on the serving endpoint, over the requests whose
	// engine reported its cached tokens; ActualCachedTokens and
	// ActualCachedBlocks add up what those engines reported (full blocks).
	// Their ratio is the routing's prediction accuracy, weighted by
	// blocks.
	PredictedCachedTokens uint64
	PredictedCachedBlocks uint64
	ActualCachedTokens    uint64
	ActualCachedBlocks    uint64
	// PromptTokens adds up the prompt tokens of those requests.
	PromptTokens uint64
	// Panics counts streams a panic ended (in the picker or the host's
	// Tokenizer), answered with codes.Internal; see Server.Process.
	Panics uint64
}

// counters are the Server's live counts.
type counters struct {
	streams, routed, badRequests, unavailable, shed, tokenizeErrors atomic.Uint64
	servedElsewhere, completed, engineErrors, canceled              atomic.Uint64
	predictedTokens, predictedBlocks, actualTokens, actualBlocks    atomic.Uint64
	promptTokens, panics                                            atomic.Uint64
}

// Stats returns a snapshot of the server's counters.
func (s *Server) Stats() Stats {
	c := &s.stats
	return Stats{
		Streams: c.streams.Load(), Routed: c.routed.Load(), BadRequests: c.badRequests.Load(),
		Unavailable: c.unavailable.Load(), Shed: c.shed.Load(), TokenizeErrors: c.tokenizeErrors.Load(),
		ServedElsewhere: c.servedElsewhere.Load(), Completed: c.completed.Load(),
		EngineErrors: c.engineErrors.Load(), Canceled: c.canceled.Load(),
		PredictedCachedTokens: c.predictedTokens.Load(), PredictedCachedBlocks: c.predictedBlocks.Load(),
		ActualCachedTokens: c.actualTokens.Load(), ActualCachedBlocks: c.actualBlocks.Load(),
		PromptTokens: c.promptTokens.Load(), Panics: c.panics.Load(),
	}
}
