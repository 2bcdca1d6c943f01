package epp

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/kvroute/kvroute"
)

// ErrEndpoint is wrapped by errors about an endpoint address.
var ErrEndpoint = errors.New("epp: invalid endpoint")

// Endpoints maps the router's cache domains to the "ip:port" addresses
// Envoy sends requests to, both ways. Discovery (or the host) keeps it in
// step with the router's workers: a worker registered in the router but
// absent here is never picked, because Envoy could not reach it.
//
// With data parallelism each rank is a cache domain of its own, served on
// a port of its own (an InferencePool's targetPorts, one per rank).
//
// Endpoints is safe for concurrent use; its zero value is empty and ready.
type Endpoints struct {
	// mu protects both maps.
	mu     sync.RWMutex
	byKey  map[kvroute.WorkerKey]string
	byAddr map[string]kvroute.WorkerKey
}

// ValidateAddress checks that addr is "ip:port" or "host:port" with a port
// from 1 to 65535.
func ValidateAddress(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: %q: %w", ErrEndpoint, addr, err)
	}
	if host == "" {
		return fmt.Errorf("%w: %q has no host", ErrEndpoint, addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%w: %q: port out of range", ErrEndpoint, addr)
	}
	return nil
}

// Set maps the cache domain key to addr, replacing any previous address of
// key and any previous domain of addr. Errors wrap ErrEndpoint.
func (e *Endpoints) Set(key kvroute.WorkerKey, addr string) error {
	if err := ValidateAddress(addr); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byKey == nil {
		e.byKey, e.byAddr = map[kvroute.WorkerKey]string{}, map[string]kvroute.WorkerKey{}
	}
	if old, ok := e.byKey[key]; ok {
		delete(e.byAddr, old)
	}
	if old, ok := e.byAddr[addr]; ok {
		delete(e.byKey, old)
	}
	e.byKey[key], e.byAddr[addr] = addr, key
	return nil
}

// DeleteWorker forgets every rank of worker id.
func (e *Endpoints) DeleteWorker(id kvroute.WorkerID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, a := range e.byKey {
		if k.ID == id {
			delete(e.byKey, k)
			delete(e.byAddr, a)
		}
	}
}

// Address returns the address of a cache domain.
func (e *Endpoints) Address(key kvroute.WorkerKey) (string, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	a, ok := e.byKey[key]
	return a, ok
}

// Key returns the cache domain served at addr.
func (e *Endpoints) Key(addr string) (kvroute.WorkerKey, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	k, ok := e.byAddr[addr]
	return k, ok
}

// Len returns the number of mapped cache domains.
func (e *Endpoints) Len() int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return len(e.byKey)
}

// All returns every mapping, sorted by cache domain.
func (e *Endpoints) All() map[kvroute.WorkerKey]string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	out := make(map[kvroute.WorkerKey]string, len(e.byKey))
	for k, a := range e.byKey {
		out[k] = a
	}
	return out
}

// exclusions appends to dst every worker of workers that has no address,
// or, when subset is not nil, whose address is not in it; it also returns
// how many of workers are allowed.
func (e *Endpoints) exclusions(dst []kvroute.WorkerKey, workers []kvroute.WorkerKey, subset map[string]bool) ([]kvroute.WorkerKey, int) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	allowed := 0
	for _, w := range workers {
		a, ok := e.byKey[w]
		if !ok || (subset != nil && !subset[a]) {
			dst = append(dst, w)
			continue
		}
		allowed++
	}
	return dst, allowed
}
