package dynamo

import (
	"fmt"
	"maps"
	"slices"
	"sync"
)

// followed is the set of sources a subscriber follows (ZMQ publishers by
// endpoint, NATS channels by subject), shared between the host's add and
// remove calls and Run's loop. Removals are synchronous: remove returns
// once Run's loop has dropped the source, so nothing it sent reaches the
// sink afterwards.
type followed[T any] struct {
	mu      sync.Mutex
	set     map[string]T
	running bool            // Run's loop is running
	waiting []chan struct{} // removals waiting for the loop to reconcile
	wake    chan struct{}   // signals Run that set changed (capacity 1)
}

func newFollowed[T any]() followed[T] {
	return followed[T]{set: make(map[string]T), wake: make(chan struct{}, 1)}
}

// put follows v under key, replacing an earlier source with that key.
func (f *followed[T]) put(key string, v T) {
	f.mu.Lock()
	f.set[key] = v
	f.mu.Unlock()
	f.notify()
}

// remove stops following key and, while Run's loop runs, waits until the
// loop has reconciled (nothing can reach the sink otherwise).
func (f *followed[T]) remove(key string) {
	f.mu.Lock()
	delete(f.set, key)
	var done chan struct{}
	if f.running {
		done = make(chan struct{})
		f.waiting = append(f.waiting, done)
	}
	f.mu.Unlock()
	f.notify()
	if done != nil {
		<-done
	}
}

// values returns the followed sources.
func (f *followed[T]) values() []T {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Values(f.set))
}

// start marks Run's loop as running; stop marks it as stopped and releases
// every waiting removal.
func (f *followed[T]) start() {
	f.mu.Lock()
	f.running = true
	f.mu.Unlock()
}

func (f *followed[T]) stop() {
	f.mu.Lock()
	f.running = false
	release(f.take())
	f.mu.Unlock()
}

// snapshot returns a copy of the set and the removals waiting for it to be
// applied: the loop releases them (release) once it has reconciled.
func (f *followed[T]) snapshot() (map[string]T, []chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.set), f.take()
}

func (f *followed[T]) take() []chan struct{} {
	w := f.waiting
	f.waiting = nil
	return w
}

func (f *followed[T]) notify() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// release closes waiters.
func release(w []chan struct{}) {
	for _, ch := range w {
		close(ch)
	}
}

// checkLimits returns an error wrapping ErrConfig when a publisher's
// capacity, block size or limits are negative.
func checkLimits(kvCapacityBlocks, blockSize, maxRequests, maxBatchedTokens int) error {
	if kvCapacityBlocks < 0 || blockSize < 0 || maxRequests < 0 || maxBatchedTokens < 0 {
		return fmt.Errorf("%w: negative capacity, block size or limit", ErrConfig)
	}
	return nil
}
