package kvevents

import "github.com/kvroute/kvroute"

// Sink receives converted events: the indexer (*indexer.Index implements
// it), or a relay such as the NATS publisher in package kvevents/natsx.
//
// Transports call Apply with one worker's events in order, numbered
// consecutively per worker (or 0), and ResetWorker when events of a worker
// were lost for good (the sink drops what it knows of the worker and the
// next event starts a new sequence). Errors returned by Apply are counted
// and logged by transports; they do not stop them.
type Sink interface {
	Apply(ev *kvroute.Event) error
	ResetWorker(w kvroute.WorkerKey)
}
