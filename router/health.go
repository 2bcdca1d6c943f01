package router

import (
	"context"
	"fmt"
	"time"
)

// Health is a worker's health as the router sees it.
type Health uint32

// The health states.
const (
	// Healthy workers are chosen normally.
	Healthy Health = iota
	// Degraded workers (late heartbeats or a few errors in a row) are
	// chosen only when no healthy worker can take the request.
	Degraded
	// Unhealthy workers (heartbeats missing for long, or many errors in a
	// row) are never chosen.
	Unhealthy
)

// String returns the state's name.
func (h Health) String() string {
	switch h {
	case Healthy:
		return "healthy"
	case Degraded:
		return "degraded"
	case Unhealthy:
		return "unhealthy"
	}
	return fmt.Sprintf("health(%d)", uint32(h))
}

// HealthConfig configures how the router derives worker health from two
// separate signals, and a worker's health is the worse of the two:
//
//   - Liveness comes from heartbeats (Router.Heartbeat): a worker whose
//     last heartbeat is older than DegradedAfter is degraded, older than
//     UnhealthyAfter unhealthy. A heartbeat says that the engine answers,
//     nothing more.
//   - Error health comes from requests: consecutive errors (Router.
//     ReportError and failed Decision.Done outcomes) make a worker degraded
//     after DegradedErrors and unhealthy after UnhealthyErrors. Only a
//     successful request clears the count, or UnhealthyAfter passing
//     without a new error (the worker then gets requests again, as a
//     circuit breaker's half-open probe). Heartbeats do not clear it: an
//     engine whose health endpoint answers while its inference fails stays
//     out of rotation instead of flapping with each probe.
//
// The zero value uses the defaults below.
type HealthConfig struct {
	// DegradedAfter is how long after its last heartbeat a worker becomes
	// degraded. Zero means 5 s.
	DegradedAfter time.Duration
	// UnhealthyAfter is how long after its last heartbeat a worker becomes
	// unhealthy. Zero means 15 s.
	UnhealthyAfter time.Duration
	// RequireHeartbeats applies the heartbeat timeouts to workers that never
	// sent one, counting from when they were added. When false, a worker is
	// judged by heartbeats only once it has sent its first.
	RequireHeartbeats bool
	// DegradedErrors is the number of consecutive errors that make a
	// worker degraded. Zero means 3.
	DegradedErrors int
	// UnhealthyErrors is the number of consecutive errors that make a
	// worker unhealthy. Zero means 5. A success resets the count, and so
	// does UnhealthyAfter without a new error; a heartbeat does not.
	UnhealthyErrors int
}

func (c HealthConfig) withDefaults() (HealthConfig, error) {
	if c.DegradedAfter == 0 {
		c.DegradedAfter = 5 * time.Second
	}
	if c.UnhealthyAfter == 0 {
		c.UnhealthyAfter = 15 * time.Second
	}
	if c.DegradedErrors == 0 {
		c.DegradedErrors = 3
	}
	if c.UnhealthyErrors == 0 {
		c.UnhealthyErrors = 5
	}
	if c.DegradedAfter < 0 || c.UnhealthyAfter < c.DegradedAfter || c.DegradedErrors < 0 || c.UnhealthyErrors < c.DegradedErrors {
		return c, fmt.Errorf("%w: health timeouts %v/%v, error counts %d/%d", ErrInvalidConfig,
			c.DegradedAfter, c.UnhealthyAfter, c.DegradedErrors, c.UnhealthyErrors)
	}
	return c, nil
}

// judge returns the health of a domain from its heartbeat age and errors.
func (c *HealthConfig) judge(d *domain, now int64) Health {
	h := Healthy
	errs := int(d.errors.Load())
	if errs > 0 && now-d.lastError.Load() >= int64(c.UnhealthyAfter) {
		// Errors are forgiven after UnhealthyAfter without a new one, so a
		// worker without heartbeats gets a chance again; an error counted
		// meanwhile is not.
		if d.errors.CompareAndSwap(int32(errs), 0) {
			errs = 0
		}
	}
	switch {
	case errs >= c.UnhealthyErrors:
		return Unhealthy
	case errs >= c.DegradedErrors:
		h = Degraded
	}
	last := d.lastHeartbeat.Load()
	if last == 0 {
		if !c.RequireHeartbeats {
			return h
		}
		last = d.added
	}
	switch age := time.Duration(now - last); {
	case age >= c.UnhealthyAfter:
		return Unhealthy
	case age >= c.DegradedAfter:
		return Degraded
	}
	return h
}

// CheckHealth re-evaluates every worker's health at the current time of
// the router's clock, and does the router's other timed housekeeping:
// tracked requests whose Done never came expire (TrackerConfig.TTL),
// expired session affinities are dropped, the blocks of workers removed
// longer than Config.RemoveGrace ago leave the index, and in approximate
// mode expired index entries are removed. The host calls it periodically
// (every second or so), or starts RunHealthChecks to have it called on a
// timer.
func (r *Router) CheckHealth() {
	s := r.snap.Load()
	for _, d := range s.domains {
		r.rejudge(d)
	}
	now := r.clock.Now().UnixNano()
	if n := r.tracker.Expire(); n > 0 {
		r.log.Debug("expired tracked requests", "count", n)
	}
	r.sessions.Range(func(key string, se session) bool {
		if se.expires < now {
			r.dropSession(key, now)
		}
		return true
	})
	// Expiry and health changes may have freed capacity.
	r.releaseAll()
	r.expireRemoved()
	if r.approx != nil {
		r.approx.Expire()
	}
}

// rejudge judges d's health at the clock's time and stores it; when it
// changed, it republishes the snapshot (Select reads health from there)
// and reports that it did.
//
// Judgements of one domain may overlap (a heartbeat, an error, an outcome,
// CheckHealth). A judgement stores its result only if no other one stored
// a result since it began; else it judges again, at the clock's time then,
// so that the result left standing is that of the newest inputs and time,
// never an earlier judgement's put back over a later one's.
func (r *Router) rejudge(d *domain) bool {
	for {
		cur := d.health.Load()
		h := r.health.judge(d, r.clock.Now().UnixNano())
		if !d.health.CompareAndSwap(cur, (cur>>32+1)<<32|uint64(h)) {
			continue
		}
		old := Health(uint32(cur))
		if old == h {
			return false
		}
		r.log.Info("worker health changed", "worker", d.key.String(), "from", old.String(), "to", h.String())
		r.republish()
		r.releaseAll()
		return true
	}
}

// currentHealth returns the domain's health as last judged.
func (s *domainState) currentHealth() Health { return Health(uint32(s.health.Load())) }

// RunHealthChecks calls CheckHealth every interval until ctx ends, then
// returns ctx's error. It is the optional health goroutine: the host starts
// it explicitly (go r.RunHealthChecks(ctx, time.Second)) or calls
// CheckHealth from its own loop instead.
func (r *Router) RunHealthChecks(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			r.CheckHealth()
		}
	}
}
