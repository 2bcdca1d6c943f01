package scheduling

import (
	"fmt"
	"math"
)

// BusyThresholds say when a worker is too loaded to take another request.
// A worker over any enabled threshold is busy and is not a candidate.
// Each zero field disables its threshold; a fractional threshold is also
// skipped for a worker whose capacity (KVCapacityBlocks, MaxBatchedTokens)
// is unknown. The zero value marks no worker busy.
type BusyThresholds struct {
	// DecodeBlocks is the maximum active decode blocks, as a fraction of
	// the worker's KVCapacityBlocks (0.9 = busy above 90% of the cache).
	DecodeBlocks float64
	// MaxDecodeBlocks is the maximum active decode blocks, absolute.
	MaxDecodeBlocks int
	// PrefillTokens is the maximum active prefill tokens, as a fraction of
	// the worker's MaxBatchedTokens.
	PrefillTokens float64
	// MaxPrefillTokens is the maximum active prefill tokens, absolute.
	MaxPrefillTokens int
}

// Validate returns an error wrapping ErrInvalidConfig when a threshold is
// negative or not finite.
func (b BusyThresholds) Validate() error {
	if !(b.DecodeBlocks >= 0) || math.IsInf(b.DecodeBlocks, 0) ||
		!(b.PrefillTokens >= 0) || math.IsInf(b.PrefillTokens, 0) ||
		b.MaxDecodeBlocks < 0 || b.MaxPrefillTokens < 0 {
		return fmt.Errorf("%w: busy thresholds %+v", ErrInvalidConfig, b)
	}
	return nil
}

// Busy reports whether l is over one of the thresholds.
func (b BusyThresholds) Busy(l *Load) bool {
	switch {
	case b.MaxDecodeBlocks > 0 && l.ActiveDecodeBlocks > b.MaxDecodeBlocks,
		b.MaxPrefillTokens > 0 && l.ActivePrefillTokens > b.MaxPrefillTokens,
		b.DecodeBlocks > 0 && l.KVCapacityBlocks > 0 &&
			float64(l.ActiveDecodeBlocks) > b.DecodeBlocks*float64(l.KVCapacityBlocks),
		b.PrefillTokens > 0 && l.MaxBatchedTokens > 0 &&
			float64(l.ActivePrefillTokens) > b.PrefillTokens*float64(l.MaxBatchedTokens):
		return true
	}
	return false
}

// Filter removes busy workers from cands in place, keeping the order of the
// others, and returns the shortened slice (which shares cands' array). It
// returns ErrNoCandidates for an empty cands and an *AllBusyError when
// every candidate is busy; cands is then unchanged.
func (b BusyThresholds) Filter(cands []Candidate) ([]Candidate, error) {
	if len(cands) == 0 {
		return cands, ErrNoCandidates
	}
	if b == (BusyThresholds{}) {
		return cands, nil // no threshold: nobody is busy
	}
	first := -1
	for i := range cands {
		if !b.Busy(&cands[i].Load) {
			first = i
			break
		}
	}
	if first < 0 {
		return cands, &AllBusyError{Candidates: len(cands)}
	}
	// Candidates are large: move only those after a busy one.
	n := first
	for i := first; i < len(cands); i++ {
		if !b.Busy(&cands[i].Load) {
			if n != i {
				cands[n] = cands[i]
			}
			n++
		}
	}
	return cands[first:n], nil
}
