package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
	"github.com/kvroute/kvroute/scheduling"
)

// scratch is the per-call working memory of Select, pooled so that a
// steady stream of decisions allocates nothing.
type scratch struct {
	req      scheduling.Request
	blocks   []kvroute.BlockHash
	seqs     []kvroute.SeqHash
	match    indexer.MatchResult
	cands    []scheduling.Candidate
	degraded int  // degraded domains left out of cands
	pinned   bool // the request's pin binds the phase of cands
	costs    []float64
	pos      []int // domain index → candidate index + 1 (0: not a candidate)
	released bool  // the request was released from the admission queue
	stripe   uint8 // the stripe of the router's counters this scratch adds to
	// ids[0] is the next tracker id of this scratch's block, ids[1] the
	// end of the block.
	ids [2]uint64
}

// idBlock is the number of tracker ids a scratch takes at a time.
const idBlock = 1024

// newID returns a tracker id unique among all of the router's ids.
func (r *Router) newID(sc *scratch) scheduling.RequestID {
	if sc.ids[0] == sc.ids[1] {
		end := r.nextID.Add(idBlock)
		sc.ids = [2]uint64{end - idBlock + 1, end + 1}
	}
	id := sc.ids[0]
	sc.ids[0]++
	return scheduling.RequestID(id)
}

// phase selects the candidates of one choice.
type phase uint8

const (
	phaseAggregated phase = iota // aggregated and decode workers (decode ones prefill themselves when no prefill worker is up)
	phasePrefill                 // prefill workers
	phaseDecode                  // decode workers
)

// accepts reports whether a domain of the role takes part in the phase.
func (p phase) accepts(role Role) bool {
	switch p {
	case phasePrefill:
		return role == RolePrefill
	case phaseDecode:
		return role == RoleDecode
	}
	return role != RolePrefill
}

// Select chooses the worker for req and starts tracking it; it is
// SelectInto with a new Decision.
func (r *Router) Select(ctx context.Context, req *Request) (*Decision, error) {
	d := new(Decision)
	if err := r.SelectInto(ctx, req, d); err != nil {
		return nil, err
	}
	return d, nil
}

// SelectInto chooses the worker for req, starts tracking it, and fills d
// (which must be new, or one whose Done was called). It hashes the prompt,
// matches it in the index, builds the candidates with their load, removes
// unhealthy and busy ones (degraded ones too when a healthy one is left),
// waits in the admission queue when every candidate is saturated, and
// chooses with the cost function and selector. When the pool has prefill
// and decode workers, it chooses one of each.
//
// Select never blocks on I/O; it blocks only in the admission queue, and
// then until ctx ends. It allocates nothing in steady state unless
// req.Explain is set.
//
// Errors: ErrNoWorkers when no eligible worker is registered and healthy;
// ErrPinnedUnavailable for a pinned request that cannot go to its pin;
// errors matching scheduling.ErrAllBusy, scheduling.ErrQueueFull or
// scheduling.ErrQueueClosed; ctx's error after a wait.
func (r *Router) SelectInto(ctx context.Context, req *Request, d *Decision) error {
	start := time.Now()
	sc := r.scratch.Get().(*scratch)
	defer r.scratch.Put(sc)
	sc.released = false

	h := r.hasher
	if req.LoRA != "" {
		h = h.WithLoRA(req.LoRA)
	}
	if req.CacheSalt != "" {
		h = h.WithSalt(req.CacheSalt)
	}
	if r.approx != nil {
		sc.blocks, sc.seqs = h.AppendHashesMM(sc.blocks[:0], sc.seqs[:0], req.Tokens, req.MM)
	} else {
		sc.seqs = h.AppendSeqHashesMM(sc.seqs[:0], req.Tokens, req.MM)
	}
	if r.approx != nil {
		r.expireApprox()
	}
	r.index.Match(sc.seqs, &sc.match)

	*d = Decision{r: r, PromptTokens: len(req.Tokens), Blocks: len(sc.seqs), stripe: sc.stripe}
	// The scheduling request lives in the pooled scratch: passed to the
	// cost function (an interface), it would escape from the stack.
	sreq := &sc.req
	*sreq = scheduling.Request{
		PromptTokens:         len(req.Tokens),
		Blocks:               len(sc.seqs),
		BlockSize:            h.BlockSize(),
		Priority:             req.Priority,
		PriorityJump:         req.PriorityJump,
		ExpectedOutputTokens: req.ExpectedOutputTokens,
		Overrides:            req.Overrides,
	}
	if r.queue != nil {
		sreq.Arrival = r.clock.Now() // only the admission queue orders by arrival
	}

	s := r.snap.Load()
	var err error
	if s.roles[RolePrefill] > 0 && s.roles[RoleDecode] > 0 && !s.pinsAggregated(req) {
		err = r.selectDisaggregated(ctx, &s, req, sreq, sc, d)
	} else {
		err = r.selectAggregated(ctx, &s, req, sreq, sc, d)
	}
	if err != nil {
		r.stats.stripe(sc.stripe).rejected.Add(1)
		*d = Decision{} // nothing to balance: its Done is a no-op
		if sc.released {
			r.release() // pass the admission on
		}
		return err
	}
	d.CachedTokens = d.CachedBlocks * h.BlockSize()

	// Track the request's load on the chosen worker(s).
	d.id = r.newID(sc)
	d.serving = s.state(d.Worker)
	if d.Disaggregated {
		d.prefillID = r.newID(sc)
		d.prefill = s.state(d.Prefill)
		r.track(d.prefillID, d.Prefill, sc.seqs, max(len(req.Tokens)-d.CachedTokens, 0))
		r.track(d.id, d.Worker, sc.seqs, 0)
	} else {
		r.track(d.id, d.Worker, sc.seqs, max(len(req.Tokens)-d.CachedTokens, 0))
	}
	if cur := r.snap.Load(); cur != s {
		r.untrackLeft(cur, d)
	}
	if sc.released {
		// Released by a load drop and admitted: the next waiter may fit too.
		r.release()
	}
	if r.approx != nil {
		if d.Disaggregated {
			r.recordApprox(d.Prefill, d.prefill, sc)
		}
		r.recordApprox(d.Worker, d.serving, sc)
	}
	if req.SessionKey != "" {
		ttl := req.SessionTTL
		if ttl <= 0 {
			ttl = r.sessionTTL
		}
		exp := r.clock.Now().Add(ttl).UnixNano()
		if cur, ok := r.sessions.Load(req.SessionKey); !ok || cur.key != d.Worker || cur.expires < exp-int64(time.Second) {
			r.sessions.Store(req.SessionKey, session{key: d.Worker, expires: exp})
		}
	}
	r.stats.record(d, time.Since(start))
	return nil
}

// untrackLeft stops tracking the load of a decision on a worker that left
// the router (or left and came back) after the decision chose it from the
// snapshot it started on and before its load was tracked: the removal
// dropped the worker's requests before this one was added, which would
// otherwise stay counted against the worker's id, and so against the next
// worker added under it, until the decision's Done. cur is the snapshot
// published after the tracking.
func (r *Router) untrackLeft(cur *snapshot, d *Decision) {
	if cur.state(d.Worker) != d.serving {
		r.untrack(d.id)
		d.id = 0
	}
	if d.Disaggregated && cur.state(d.Prefill) != d.prefill {
		r.untrack(d.prefillID)
		d.prefillID = 0
	}
}

// recordApprox records in the approximate index that cache domain k, in
// the incarnation whose state is st, now holds the prompt's blocks, unless
// that incarnation has left the router: its removal cleared its blocks
// from the index, or will when its grace passes, and blocks recorded
// after that would stay for a worker that is gone or be taken for the
// cache of one added under its id since.
func (r *Router) recordApprox(k kvroute.WorkerKey, st *domainState, sc *scratch) {
	st.leaving.RLock()
	defer st.leaving.RUnlock()
	if !st.left {
		r.approx.Insert(k, sc.seqs)
	}
}

// state returns the state of cache domain k in s, nil when s does not hold
// it.
func (s *snapshot) state(k kvroute.WorkerKey) *domainState {
	if i, ok := s.byKey.get(k); ok {
		return s.domains[i].domainState
	}
	return nil
}

// pinsAggregated reports whether req is pinned to a worker that serves
// both phases: the pin binds both, so a pool of prefill and decode
// workers routes it as an aggregated one.
func (s *snapshot) pinsAggregated(req *Request) bool {
	i, ok := s.byKey.get(req.Pin)
	return req.HasPin && ok && s.domains[i].role == RoleAggregated
}

// selectAggregated chooses one worker for both phases.
func (r *Router) selectAggregated(ctx context.Context, s **snapshot, req *Request, sreq *scheduling.Request, sc *scratch, d *Decision) error {
	c, err := r.choose(ctx, s, phaseAggregated, req, sreq, sc, r.cost, d)
	if err != nil {
		return err
	}
	d.Worker, d.CachedBlocks = c.Worker, c.CachedBlocks()
	return nil
}

// selectDisaggregated chooses a prefill and a decode worker, each phase on
// the snapshot the one before it ended on (a wait in the admission queue
// may have seen workers come and go).
func (r *Router) selectDisaggregated(ctx context.Context, s **snapshot, req *Request, sreq *scheduling.Request, sc *scratch, d *Decision) error {
	p, err := r.choose(ctx, s, phasePrefill, req, sreq, sc, r.cost, d)
	if err != nil {
		if !errors.Is(err, ErrNoWorkers) && !errors.Is(err, scheduling.ErrAllBusy) && !errors.Is(err, scheduling.ErrNoCandidates) {
			return err // the request's context ended, or the queue refused it
		}
		// No prefill worker can take it: decode workers prefill
		// themselves, as an aggregated pool would.
		if r.selectAggregated(ctx, s, req, sreq, sc, d) != nil {
			return err
		}
		return nil
	}
	d.Prefill, d.CachedBlocks = p.Worker, p.CachedBlocks()
	prefillCost := d.Cost
	dc, err := r.choose(ctx, s, phaseDecode, req, sreq, sc, r.decodeCost, d)
	if err != nil {
		return err
	}
	d.Disaggregated = true
	d.Worker = dc.Worker
	d.Cost = prefillCost
	cached := dc.CachedBlocks()
	d.Transfer = Transfer{From: d.Prefill, To: d.Worker, FirstBlock: cached, Blocks: max(d.Blocks-cached, 0)}
	return nil
}

// choose builds the candidates of one phase from the snapshot *sp and
// picks one; after a wait in the admission queue it looks at the current
// snapshot, and leaves it in *sp. The returned candidate lives in sc until
// the next choose.
func (r *Router) choose(ctx context.Context, sp **snapshot, ph phase, req *Request, sreq *scheduling.Request, sc *scratch, cost scheduling.CostFunc, d *Decision) (*scheduling.Candidate, error) {
	var waitedFrom time.Time
	s := *sp
	for {
		var releases uint64
		if r.queue != nil {
			releases = r.queue.Releases() // before the loads are read
		}
		cands, err := r.eligible(s, ph, false, req, sc)
		if err != nil && sc.degraded > 0 {
			// No healthy worker can take it: fall back to degraded ones.
			cands, err = r.eligible(s, ph, true, req, sc)
		}
		if err != nil {
			return nil, err
		}
		if r.queue != nil && ph != phaseDecode && !(req.Admitted && req.HasPin) {
			saturated := r.queue.Saturated(cands)
			if saturated || r.queue.Len() > 0 {
				if waitedFrom.IsZero() {
					waitedFrom = time.Now()
				}
				item := scheduling.NewItem(sreq, cands)
				item.Releases = releases
				if err := r.queue.Wait(ctx, item, saturated); err != nil {
					return nil, err
				}
				sc.released = true
				if saturated {
					// Released: the loads changed, look again.
					d.Waited = time.Since(waitedFrom)
					s = r.snap.Load()
					*sp = s
					continue
				}
			}
		}
		if len(sc.costs) < len(cands) {
			sc.costs = make([]float64, len(cands))
		}
		i := -1
		if req.SessionKey != "" && !req.HasPin {
			i = r.sessionChoice(req.SessionKey, cands)
		}
		if i < 0 {
			if i, err = scheduling.Choose(cost, r.sel, sreq, cands, sc.costs); err != nil {
				return nil, err
			}
		} else {
			cost.Costs(sreq, cands, sc.costs[:len(cands)])
		}
		d.Cost = sc.costs[i]
		if req.Explain {
			r.explain(cands, sc, d)
		}
		if r.debug {
			r.logDecision(ctx, ph, cands, sc.costs[:len(cands)], i)
		}
		return &cands[i], nil
	}
}

// eligible returns the candidates of phase ph that are not busy, healthy
// ones only unless withDegraded is set; sc.degraded counts the degraded
// domains left out.
func (r *Router) eligible(s *snapshot, ph phase, withDegraded bool, req *Request, sc *scratch) ([]scheduling.Candidate, error) {
	if err := r.candidates(s, ph, withDegraded, req, sc); err != nil {
		return nil, err
	}
	if req.Admitted && sc.pinned {
		// Running there already, busy or not.
		if len(sc.cands) == 0 {
			return nil, fmt.Errorf("%w: %s", ErrPinnedUnavailable, req.Pin)
		}
		return sc.cands, nil
	}
	cands, err := r.busy.Filter(sc.cands)
	if err != nil && sc.pinned {
		return nil, fmt.Errorf("%w: %s is busy", ErrPinnedUnavailable, req.Pin)
	}
	return cands, err
}

// candidates fills sc.cands with the eligible domains of phase ph (healthy
// ones, and degraded ones too when withDegraded is set) and their overlap
// and load; sc.degraded counts the degraded domains left out.
func (r *Router) candidates(s *snapshot, ph phase, withDegraded bool, req *Request, sc *scratch) error {
	ps := &s.phases[ph]
	n := ps.healthy
	if withDegraded {
		n = len(ps.cands)
	}
	sc.degraded = len(ps.cands) - n
	sc.cands = append(sc.cands[:0], ps.cands[:n]...)
	doms := ps.doms[:n]
	pinned := req.HasPin
	if pinned {
		// A pin binds the phase of the pinned worker's role; in a
		// disaggregated pool the other phase chooses freely.
		if i, ok := s.byKey.get(req.Pin); ok && !ph.accepts(s.domains[i].role) {
			pinned = false
		}
	}
	sc.pinned = pinned
	if pinned {
		i, ok := ps.pos.get(req.Pin)
		switch {
		case ok && i < n:
			sc.cands = append(sc.cands[:0], ps.cands[i])
			doms = ps.doms[i : i+1]
		case ok:
			sc.cands = sc.cands[:0] // degraded: allowed on the second pass
			doms = nil
		default:
			return fmt.Errorf("%w: %s", ErrPinnedUnavailable, req.Pin)
		}
	}
	// sc.cands and doms are aligned with the template here: merge load
	// reports and overlaps by position, then drop excluded workers.
	if s.reported {
		for i, dm := range doms {
			switch rep := dm.reported.Load(); {
			case rep == nil:
			case r.merge:
				mergeReported(&sc.cands[i].Load, rep)
			default:
				takeCapacities(&sc.cands[i].Load, rep)
			}
		}
	}
	for _, m := range sc.match.Workers {
		if pinned {
			if len(sc.cands) == 1 && m.Worker == req.Pin {
				sc.cands[0].Cached = m.ByTier
			}
		} else if i, ok := ps.pos.get(m.Worker); ok && i < n {
			sc.cands[i].Cached = m.ByTier
		}
	}
	if len(req.Exclude) > 0 {
		sc.cands = slices.DeleteFunc(sc.cands, func(c scheduling.Candidate) bool {
			return slices.Contains(req.Exclude, c.Worker)
		})
	}
	if len(sc.cands) == 0 {
		return ErrNoWorkers
	}
	if r.staleness {
		for i := range sc.cands {
			if at, ok := r.index.LastUpdate(sc.cands[i].Worker); ok {
				sc.cands[i].LastUpdate = at
			}
		}
	}
	if !r.merge {
		for i := range sc.cands {
			r.tracker.FillLoad(&sc.cands[i], sc.seqs)
		}
		return nil
	}
	for i := range sc.cands {
		c := &sc.cands[i]
		reported := c.Load
		r.tracker.FillLoad(c, sc.seqs)
		// The engine's own counts include requests other routers sent.
		c.Load.ActiveRequests = max(c.Load.ActiveRequests, reported.ActiveRequests)
		c.Load.ActivePrefillTokens = max(c.Load.ActivePrefillTokens, reported.ActivePrefillTokens)
		if extra := reported.ActiveDecodeBlocks - c.Load.ActiveDecodeBlocks; extra > 0 {
			c.Load.ActiveDecodeBlocks += extra
			c.Load.PotentialDecodeBlocks += extra
		}
	}
	return nil
}

// mergeReported copies an engine's load report over the static
// capacities: the report's counts, and its capacities where it has them
// (takeCapacities).
func mergeReported(l *scheduling.Load, rep *scheduling.Load) {
	caps := *l
	takeCapacities(&caps, rep)
	*l = *rep
	l.MaxBatchedTokens, l.MaxRequests = caps.MaxBatchedTokens, caps.MaxRequests
	l.KVCapacityBlocks, l.PrefillTokensPerSecond = caps.KVCapacityBlocks, caps.PrefillTokensPerSecond
}

// takeCapacities copies an engine's reported capacities over the static
// ones, leaving a static one where the report has none
// (LoadReportCapacities).
func takeCapacities(l *scheduling.Load, rep *scheduling.Load) {
	if rep.MaxBatchedTokens != 0 {
		l.MaxBatchedTokens = rep.MaxBatchedTokens
	}
	if rep.MaxRequests != 0 {
		l.MaxRequests = rep.MaxRequests
	}
	if rep.KVCapacityBlocks != 0 {
		l.KVCapacityBlocks = rep.KVCapacityBlocks
	}
	if rep.PrefillTokensPerSecond != 0 {
		l.PrefillTokensPerSecond = rep.PrefillTokensPerSecond
	}
}

// dropSession deletes the session key if it is still expired at now; a
// concurrent Select that refreshed it keeps it.
func (r *Router) dropSession(key string, now int64) {
	r.sessions.Compute(key, func(se session, loaded bool) (session, bool) {
		return se, !loaded || se.expires < now
	})
}

// sessionChoice returns the index of the session's worker among cands, or
// -1 when the session is unknown, expired or its worker is not a candidate.
func (r *Router) sessionChoice(key string, cands []scheduling.Candidate) int {
	se, ok := r.sessions.Load(key)
	if !ok {
		return -1
	}
	if now := r.clock.Now().UnixNano(); se.expires < now {
		r.dropSession(key, now)
		return -1
	}
	for i := range cands {
		if cands[i].Worker == se.key {
			return i
		}
	}
	return -1
}

func (r *Router) explain(cands []scheduling.Candidate, sc *scratch, d *Decision) {
	for i := range cands {
		c := &cands[i]
		hl := Healthy
		if dm := r.domain(c.Worker); dm != nil {
			hl = dm.currentHealth()
		}
		d.Candidates = append(d.Candidates, CandidateCost{Worker: c.Worker, Cached: c.Cached, Load: c.Load, Health: hl, Cost: sc.costs[i]})
	}
}

func (r *Router) logDecision(ctx context.Context, ph phase, cands []scheduling.Candidate, costs []float64, chosen int) {
	attrs := make([]any, 0, 2*len(cands)+4)
	attrs = append(attrs, slog.String("chosen", cands[chosen].Worker.String()), slog.Int("phase", int(ph)))
	for i := range cands {
		attrs = append(attrs, slog.Group(cands[i].Worker.String(),
			slog.Int("overlap_blocks", cands[i].CachedBlocks()),
			slog.Int("active_prefill_tokens", cands[i].Load.ActivePrefillTokens),
			slog.Int("potential_decode_blocks", cands[i].Load.PotentialDecodeBlocks),
			slog.Float64("cost", costs[i])))
	}
	r.log.DebugContext(ctx, "routing decision", attrs...)
}
