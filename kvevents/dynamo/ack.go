package dynamo

// removals lets RemovePublisher and RemoveChannel wait until Run's loop
// has dropped what they removed. Its fields are protected by the
// subscriber's mutex.
type removals struct {
	running bool            // Run's loop is running
	waiting []chan struct{} // closed once the loop has reconciled
}

// wait registers a waiter and returns its channel, or nil when no loop
// runs (nothing can reach the sink then).
func (r *removals) wait() chan struct{} {
	if !r.running {
		return nil
	}
	ch := make(chan struct{})
	r.waiting = append(r.waiting, ch)
	return ch
}

// take returns the waiters registered so far, to be released once the
// loop has applied the removals they wait for.
func (r *removals) take() []chan struct{} {
	w := r.waiting
	r.waiting = nil
	return w
}

// release closes waiters.
func release(w []chan struct{}) {
	for _, ch := range w {
		close(ch)
	}
}
