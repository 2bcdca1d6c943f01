// Package etcd discovers inference engines registered under an etcd key
// prefix: each engine (or a sidecar next to it) keeps a key alive with a
// lease, and a Watcher feeds the set of keys to a discovery.Sink. When an
// engine dies, its lease expires, its key goes and the Sink drops it.
//
// # Usage
//
// On the engine's side, Register puts prefix+name with the engine's JSON
// description (discovery.Engine) under a lease of the given TTL and keeps
// it alive until its context ends, then revokes it:
//
//	go etcd.Register(ctx, client, "/kvroute/pool-a/", discovery.Engine{
//		Name: "vllm-0", Host: "10.0.0.7", Ports: []int{8000}, Ready: true,
//		Events: "tcp://10.0.0.7:5557", Metrics: "http://10.0.0.7:8000/metrics",
//	}, 10*time.Second)
//
// On the router's side, a Watcher lists the prefix, calls Sync with every
// engine, then follows the prefix's changes and calls Sync again after
// each:
//
//	w := &etcd.Watcher{Client: client, Prefix: "/kvroute/pool-a/"}
//	return w.Run(ctx, pool) // a *discovery.Pool
//
// A value that is not a valid description (or that names an engine another
// key already describes) is logged and left out: the engines already
// known stay as they were, the key's own last valid description included. When the watch breaks (compaction, a lost
// connection) the Watcher lists the prefix again.
package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/internal/etcdwatch"
)

// ErrConfig is wrapped by errors about a Watcher's or Register's
// arguments.
var ErrConfig = errors.New("etcd: invalid configuration")

// Watcher feeds the engines registered under an etcd key prefix to a
// discovery.Sink.
type Watcher struct {
	// Client is the etcd client. Required.
	Client *clientv3.Client
	// Prefix is the key prefix, such as "/kvroute/pool-a/". Required.
	Prefix string
	// Logger receives invalid values and broken watches. Nil discards.
	Logger *slog.Logger
	// Backoff is the wait before listing again after an error. Zero
	// means one second.
	Backoff time.Duration
}

// Run lists the prefix, syncs the sink, and follows changes until ctx ends;
// it then returns ctx's error.
func (w *Watcher) Run(ctx context.Context, sink discovery.Sink) error {
	if w.Client == nil || w.Prefix == "" || sink == nil {
		return fmt.Errorf("%w: Client, Prefix and a sink are required", ErrConfig)
	}
	log := w.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &follower{w: w, sink: sink, log: log}
	return etcdwatch.Follow(ctx, w.Client, w.Prefix, w.Backoff, log, "etcd", f)
}

// follower keeps the engines of one listing and the watch after it, and
// syncs the sink after each change.
type follower struct {
	w    *Watcher
	sink discovery.Sink
	log  *slog.Logger
	set  *engineSet
}

func (f *follower) Relisted() { f.set = newEngineSet(f.w.Prefix) }

func (f *follower) Changed(ctx context.Context, changes []etcdwatch.Change) {
	for _, c := range changes {
		if c.Deleted {
			f.set.delete(c.Key)
		} else {
			f.w.put(ctx, f.set, c.Key, c.Value, f.log)
		}
	}
	f.sink.Sync(ctx, f.set.engines())
}

// put stores one value in set and logs a refused one.
func (w *Watcher) put(ctx context.Context, set *engineSet, key string, value []byte, log *slog.Logger) {
	if err := set.put(key, value); err != nil {
		log.WarnContext(ctx, "etcd: invalid engine description left out", "key", key, "err", err)
	}
}

// engineSet holds the engines registered under a prefix, by key, as the
// listing and the watch events describe them.
type engineSet struct {
	prefix string
	byKey  map[string]discovery.Engine
	names  map[string]string // engine name to its key
	// waiting are valid descriptions refused because another key held
	// their name, by key: the first by key order takes the name when it
	// is freed.
	waiting map[string]discovery.Engine
}

func newEngineSet(prefix string) *engineSet {
	return &engineSet{prefix: prefix, byKey: map[string]discovery.Engine{}, names: map[string]string{},
		waiting: map[string]discovery.Engine{}}
}

// put decodes key's new value. A value that is not a valid description
// is refused with an error wrapping discovery.ErrEngine and changes
// nothing: the key keeps its last valid description, if it had one, until
// it is deleted. A valid one that names an engine another key describes
// is refused too, changing nothing yet, and waits: it becomes the key's
// description when the other key gives the name up.
func (s *engineSet) put(key string, value []byte) error {
	e, err := Decode(strings.TrimPrefix(key, s.prefix), value)
	if err != nil {
		if old, ok := s.byKey[key]; ok {
			return fmt.Errorf("%w (keeping the last valid description of %s)", err, old.Name)
		}
		return err
	}
	if other, ok := s.names[e.Name]; ok && other != key {
		s.waiting[key] = e
		return fmt.Errorf("%w: %s: the name is key %q's already", discovery.ErrEngine, e.Name, other)
	}
	delete(s.waiting, key)
	s.set(key, e)
	return nil
}

// set makes e, whose name is free or key's, key's engine.
func (s *engineSet) set(key string, e discovery.Engine) {
	old, had := s.byKey[key]
	s.byKey[key] = e
	s.names[e.Name] = key
	if had && old.Name != e.Name {
		delete(s.names, old.Name)
		s.promote(old.Name)
	}
}

// delete removes key's engine, and any description of it waiting.
func (s *engineSet) delete(key string) {
	delete(s.waiting, key)
	old, ok := s.byKey[key]
	if !ok {
		return
	}
	delete(s.names, old.Name)
	delete(s.byKey, key)
	s.promote(old.Name)
}

// promote gives the freed name to the first key, in key order, whose
// description waits for it.
func (s *engineSet) promote(name string) {
	for _, k := range slices.Sorted(maps.Keys(s.waiting)) {
		if e := s.waiting[k]; e.Name == name {
			delete(s.waiting, k)
			s.set(k, e)
			return
		}
	}
}

// engines returns the engines in key order.
func (s *engineSet) engines() []discovery.Engine {
	out := make([]discovery.Engine, 0, len(s.byKey))
	for _, k := range slices.Sorted(maps.Keys(s.byKey)) {
		out = append(out, s.byKey[k])
	}
	return out
}

// Decode reads an engine description stored under name. The name is the
// engine's name unless the value gives one. Errors wrap
// discovery.ErrEngine.
func Decode(name string, value []byte) (discovery.Engine, error) {
	var e discovery.Engine
	if err := json.Unmarshal(value, &e); err != nil {
		return e, fmt.Errorf("%w: %s: %w", discovery.ErrEngine, name, err)
	}
	if e.Name == "" {
		e.Name = name
	}
	return e, e.Validate()
}

// Register puts prefix+e.Name with e's JSON description under a lease of
// ttl (rounded up to whole seconds, at least 2) and keeps the lease alive
// until ctx ends, then revokes it so the engine leaves at once. If the
// lease is lost (etcd unreachable longer than ttl) it registers again.
// It returns ctx's error.
func Register(ctx context.Context, c *clientv3.Client, prefix string, e discovery.Engine, ttl time.Duration) error {
	if c == nil || prefix == "" {
		return fmt.Errorf("%w: a client and a prefix are required", ErrConfig)
	}
	if err := e.Validate(); err != nil {
		return err
	}
	value, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("%w: %w", discovery.ErrEngine, err)
	}
	secs := max(int64((ttl+time.Second-1)/time.Second), 2)
	for {
		err := register(ctx, c, prefix+e.Name, string(value), secs)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		_ = err // lost the lease or etcd: try again after a pause
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func register(ctx context.Context, c *clientv3.Client, key, value string, secs int64) error {
	lease, err := c.Grant(ctx, secs)
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_, _ = c.Revoke(rctx, lease.ID)
	}()
	if _, err := c.Put(ctx, key, value, clientv3.WithLease(lease.ID)); err != nil {
		return err
	}
	alive, err := c.KeepAlive(ctx, lease.ID)
	if err != nil {
		return err
	}
	for range alive {
	}
	return errors.New("etcd: lease keep-alive ended")
}
