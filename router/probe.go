package router

import (
	"fmt"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

// Probe is one health probe of a cache domain (an HTTP health check, a
// load-report scrape), bound to the incarnation of the worker registered
// when the probe started. A worker removed and added again under the same
// id is a new incarnation, as it is for a Decision's outcome: the result
// of a probe of the old one, arriving after the removal, concerns an
// engine that is no longer the one registered and is dropped, where
// Heartbeat and ReportError, which name the domain by its key, would
// apply it to whatever is registered under the key when it arrives.
//
// A Probe is a small value, safe for concurrent use; its methods are
// cheap and may be called any number of times.
type Probe struct {
	r *Router
	d *domain
}

// Probe returns the handle of a probe of cache domain w starting now, for
// the worker registered as w now. It returns ErrUnknownWorker when w is
// not registered.
func (r *Router) Probe(w kvroute.WorkerKey) (Probe, error) {
	d := r.domain(w)
	if d == nil {
		return Probe{}, fmt.Errorf("%w: %s", ErrUnknownWorker, w)
	}
	return Probe{r: r, d: d}, nil
}

// Worker returns the probed cache domain.
func (p Probe) Worker() kvroute.WorkerKey {
	if p.d == nil {
		return kvroute.WorkerKey{}
	}
	return p.d.key
}

// Alive records that the probe found the domain answering: a heartbeat
// (see Router.Heartbeat) that keeps the domain's last load report, as a
// probe says that the engine answers, not what it carries. It returns
// ErrUnknownWorker when the probed worker has left the router since the
// probe started.
func (p Probe) Alive() error {
	if err := p.current(); err != nil {
		return err
	}
	p.r.heartbeat(p.d, nil)
	return nil
}

// Report records a load report the probe brought back, as Router.Heartbeat
// does. It returns ErrUnknownWorker when the probed worker has left the
// router since the probe started: the report is not applied to a worker
// added under its id since, nor kept.
func (p Probe) Report(load scheduling.Load) error {
	if err := p.current(); err != nil {
		return err
	}
	p.r.heartbeat(p.d, &load)
	return nil
}

// Failed records that the probe failed, as Router.ReportError does. It
// returns ErrUnknownWorker when the probed worker has left the router
// since the probe started: the failure does not count against a worker
// added under its id since.
func (p Probe) Failed(err error) error {
	if err := p.current(); err != nil {
		return err
	}
	p.r.noteError(p.d)
	p.r.log.Debug("worker probe failed", "worker", p.d.key.String(), "err", err)
	return nil
}

// current returns ErrUnknownWorker when the probed incarnation has left
// the router. A result recorded while it leaves lands on its state, which
// the router no longer reads.
func (p Probe) current() error {
	if p.d == nil {
		return fmt.Errorf("%w: no probe", ErrUnknownWorker)
	}
	p.d.leaving.RLock()
	left := p.d.left
	p.d.leaving.RUnlock()
	if left {
		return fmt.Errorf("%w: %s was removed since the probe started", ErrUnknownWorker, p.d.key)
	}
	return nil
}
