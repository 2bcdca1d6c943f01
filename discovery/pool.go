package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/kvevents/zmq"
	"github.com/kvroute/kvroute/router"
)

// ErrEngine is wrapped by errors about an engine's description.
var ErrEngine = errors.New("discovery: invalid engine")

// Engine is one inference engine as a discovery source reports it. The
// JSON names are those of the etcd value and the documented annotations.
type Engine struct {
	// Name identifies the engine in its source (pod namespace/name, etcd
	// key). Required.
	Name string `json:"name"`
	// ID is its worker id in the router; zero means WorkerIDOf(Name).
	ID kvroute.WorkerID `json:"id,omitempty"`
	// Host is the engine's IP address (or host name).
	Host string `json:"host"`
	// Ports are its HTTP ports, one per data-parallel rank. Required.
	Ports []int `json:"ports"`
	// Ready engines are routed to; others are treated as absent.
	Ready bool `json:"ready"`
	// Events is rank 0's ZMQ KV-event PUB endpoint ("tcp://ip:5557");
	// rank r publishes on the port plus r. Empty: no events.
	Events string `json:"events,omitempty"`
	// Replay is rank 0's ZMQ replay endpoint; rank r's is the port plus
	// r. Empty disables replay.
	Replay string `json:"replay,omitempty"`
	// Topic is the KV-event topic; empty receives every topic.
	Topic string `json:"topic,omitempty"`
	// Metrics is the engine's Prometheus metrics URL; empty for none.
	Metrics string `json:"metrics,omitempty"`
	// Kind names the engine's metrics ("vllm", "sglang", empty: auto).
	Kind string `json:"kind,omitempty"`

	// Ranks is the number of data-parallel ranks of an engine without
	// Ports: one reached through a shared URL and a per-worker header
	// (Dynamo's frontend), which gets no AddressBook entry. With Ports it
	// must be zero or len(Ports).
	Ranks int `json:"ranks,omitempty"`
	// BlockSize is the engine's KV block size when its source reports it;
	// an engine whose block size differs from the router's is left out
	// with an *enginemetrics.BlockSizeError. Zero: unknown.
	BlockSize int `json:"block_size,omitempty"`
	// KVBlocks, MaxRequests and MaxBatchedTokens are the engine's KV cache
	// size in blocks per rank and its batch limits, when known; the
	// default router worker reports them (router.Capacity).
	KVBlocks         int `json:"kv_blocks,omitempty"`
	MaxRequests      int `json:"max_requests,omitempty"`
	MaxBatchedTokens int `json:"max_batched_tokens,omitempty"`
	// Role is "aggregated" (or empty), "prefill" or "decode".
	Role string `json:"role,omitempty"`
	// DynamoEvents are the engine's publishers on Dynamo's event plane
	// (its envelope names the worker and rank of each event), for engines
	// found by package discovery/dynamo; the Pool subscribes with
	// PoolConfig.DynamoEvents.
	DynamoEvents []DynamoPublisher `json:"dynamo_events,omitempty"`
}

// DynamoPublisher is one of an engine's kv-events publishers on Dynamo's
// event plane.
type DynamoPublisher struct {
	// Endpoint is its ZMQ PUB endpoint ("tcp://10.0.0.7:41569").
	Endpoint string `json:"endpoint"`
	// Rank is the data-parallel rank it publishes for.
	Rank int `json:"rank"`
	// Recovery is the worker's KV query endpoint on Dynamo's TCP request
	// plane ("host:port/path"), from which a subscriber restores the
	// worker's cache and the events it missed; empty for none.
	Recovery string `json:"recovery,omitempty"`
}

// RankCount returns the engine's number of data-parallel ranks:
// len(Ports), or Ranks for an engine without ports.
func (e *Engine) RankCount() int {
	if len(e.Ports) > 0 {
		return len(e.Ports)
	}
	return e.Ranks
}

// ParseRole returns the router role a name gives: "" or "aggregated",
// "prefill", "decode".
func ParseRole(s string) (router.Role, error) {
	switch s {
	case "", "aggregated":
		return router.RoleAggregated, nil
	case "prefill":
		return router.RolePrefill, nil
	case "decode":
		return router.RoleDecode, nil
	}
	return 0, fmt.Errorf("%w: unknown role %q", ErrEngine, s)
}

// WorkerIDOf returns the worker id derived from an engine's name:
// XXH3-64 of the name, so that every router replica gives an engine the
// same id.
func WorkerIDOf(name string) kvroute.WorkerID {
	id := xxh3.HashString(name)
	if id == 0 {
		id = 1
	}
	return kvroute.WorkerID(id)
}

// Address returns rank r's "host:port".
func (e *Engine) Address(r int) string {
	return net.JoinHostPort(e.Host, strconv.Itoa(e.Ports[r]))
}

// Validate checks the engine's fields.
func (e *Engine) Validate() error {
	if e.Name == "" {
		return fmt.Errorf("%w: no name", ErrEngine)
	}
	if len(e.Ports) == 0 {
		if e.Ranks < 1 || e.Ranks > router.MaxDataParallelRanks {
			return fmt.Errorf("%w: %s: no ports and %d ranks, want 1 to %d", ErrEngine, e.Name, e.Ranks, router.MaxDataParallelRanks)
		}
		if e.Events != "" {
			return fmt.Errorf("%w: %s: vLLM events need per-rank ports", ErrEngine, e.Name)
		}
	} else {
		if e.Host == "" {
			return fmt.Errorf("%w: %s: no host", ErrEngine, e.Name)
		}
		if len(e.Ports) > router.MaxDataParallelRanks {
			return fmt.Errorf("%w: %s: %d ports, want 1 to %d", ErrEngine, e.Name, len(e.Ports), router.MaxDataParallelRanks)
		}
		if e.Ranks != 0 && e.Ranks != len(e.Ports) {
			return fmt.Errorf("%w: %s: %d ranks but %d ports", ErrEngine, e.Name, e.Ranks, len(e.Ports))
		}
	}
	if e.BlockSize < 0 || e.KVBlocks < 0 || e.MaxRequests < 0 || e.MaxBatchedTokens < 0 {
		return fmt.Errorf("%w: %s: negative block size or capacity", ErrEngine, e.Name)
	}
	if _, err := ParseRole(e.Role); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrEngine, e.Name, err)
	}
	for _, p := range e.DynamoEvents {
		if p.Endpoint == "" || p.Rank < 0 || p.Rank >= e.RankCount() {
			return fmt.Errorf("%w: %s: Dynamo publisher %q of rank %d", ErrEngine, e.Name, p.Endpoint, p.Rank)
		}
	}
	for _, p := range e.Ports {
		if p < 1 || p > 65535 {
			return fmt.Errorf("%w: %s: port %d out of range", ErrEngine, e.Name, p)
		}
	}
	if e.Replay != "" && e.Events == "" {
		return fmt.Errorf("%w: %s: replay endpoint without an events endpoint", ErrEngine, e.Name)
	}
	for _, ep := range []string{e.Events, e.Replay} {
		if ep == "" {
			continue
		}
		if err := checkEndpoint(ep); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrEngine, e.Name, err)
		}
		for r := range e.Ports {
			if _, err := RankEndpoint(ep, r); err != nil {
				return fmt.Errorf("%w: %s: %w", ErrEngine, e.Name, err)
			}
		}
	}
	if _, err := enginemetrics.ParseKind(e.Kind); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrEngine, e.Name, err)
	}
	return nil
}

// checkEndpoint checks that ep is a ZMQ endpoint a subscriber can dial:
// tcp://host:port with a port from 1 to 65535, or ipc:// or inproc://
// with a path (whose ranks have no ports to offset).
func checkEndpoint(ep string) error {
	for _, local := range []string{"ipc://", "inproc://"} {
		if rest, ok := strings.CutPrefix(ep, local); ok && rest != "" {
			return nil
		}
	}
	addr, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return fmt.Errorf("endpoint %q is not tcp://host:port", ep)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return fmt.Errorf("endpoint %q is not tcp://host:port", ep)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("endpoint %q: port out of range", ep)
	}
	return nil
}

// RankEndpoint returns data-parallel rank r's ZMQ endpoint: the
// endpoint's port plus r. Rank 0 and an empty endpoint are returned as is.
func RankEndpoint(ep string, r int) (string, error) {
	if ep == "" || r == 0 {
		return ep, nil
	}
	i := strings.LastIndexByte(ep, ':')
	if i < 0 {
		return "", fmt.Errorf("endpoint %q has no port to offset for rank %d", ep, r)
	}
	port, err := strconv.Atoi(ep[i+1:])
	if err != nil || port+r > 65535 {
		return "", fmt.Errorf("endpoint %q has no port to offset for rank %d", ep, r)
	}
	return ep[:i+1] + strconv.Itoa(port+r), nil
}

// AddressBook receives each cache domain's address; *epp.Endpoints is one.
type AddressBook interface {
	Set(key kvroute.WorkerKey, addr string) error
	DeleteWorker(id kvroute.WorkerID)
}

// Sink receives the full set of engines each time it changes; *Pool is
// one. Sync is called from one goroutine at a time.
type Sink interface {
	Sync(ctx context.Context, engines []Engine)
}

// PoolConfig configures a Pool.
type PoolConfig struct {
	// Router receives AddWorker and RemoveWorker calls. Required.
	Router *router.Router
	// Addresses receives each cache domain's address; nil for none.
	Addresses AddressBook
	// Scraper, when set, verifies each engine's block size before it is
	// registered and reports its load until it leaves. Engines without a
	// metrics URL are registered unchecked.
	Scraper *enginemetrics.Scraper
	// Subscriber is the template of each engine's KV-event subscriber
	// (timeouts, logger); the endpoints, topic, converter worker, default
	// rank (the endpoint's, for batches that carry none), block size and
	// sink are filled in per rank.
	Subscriber zmq.Config
	// Admit, when set, is asked about each engine before it is
	// registered (after the block-size check); an error leaves the engine
	// out (see Rejected) until a later retry admits it. The token parity
	// probe of package render is one such check.
	Admit func(ctx context.Context, e *Engine) error
	// DynamoEvents builds the subscriber of one of an engine's Dynamo
	// event-plane publishers (Engine.DynamoEvents), which applies its
	// events to the router's index while it runs; package
	// discovery/dynamo provides one. Engines that list such publishers
	// are left out while it is nil.
	DynamoEvents func(e *Engine, p DynamoPublisher) (EventRunner, error)
	// Worker builds the router's description of an engine; nil means a
	// router.StaticWorker with the engine's ranks, role and capacities and
	// the router's block size.
	Worker func(e *Engine) router.Worker
	// RetryInterval is how often engines the last Sync left out (a failed
	// block-size check, an engine whose metrics did not answer yet) are
	// tried again, since sources call Sync only when something changes.
	// Zero means 5 s; negative disables retries.
	RetryInterval time.Duration
	// Logger receives a record per engine added, removed or rejected.
	// Nil discards.
	Logger *slog.Logger
}

// EventRunner is a KV-event subscriber the Pool runs for a member until
// the member leaves; Run returns when ctx ends.
type EventRunner interface {
	Run(ctx context.Context) error
}

// member is a registered engine and the goroutines serving it.
type member struct {
	engine Engine
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// Pool reconciles a router with a discovered set of engines. Sync,
// Members, Rejected and Close are safe for concurrent use.
type Pool struct {
	cfg PoolConfig
	log *slog.Logger
	ctx context.Context
	end context.CancelFunc

	// mu protects members, rejected, last and closed, and serialises
	// Sync.
	mu       sync.Mutex
	members  map[string]*member
	rejected map[string]error
	last     []Engine // the last Sync's engines
	closed   bool
	retried  sync.WaitGroup
}

// NewPool returns an empty Pool.
func NewPool(cfg PoolConfig) (*Pool, error) {
	if cfg.Router == nil {
		return nil, fmt.Errorf("%w: PoolConfig.Router is required", ErrEngine)
	}
	p := &Pool{cfg: cfg, log: cfg.Logger, members: map[string]*member{}, rejected: map[string]error{}}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.ctx, p.end = context.WithCancel(context.Background())
	interval := cfg.RetryInterval
	if interval == 0 {
		interval = 5 * time.Second
	}
	if interval > 0 {
		p.retried.Go(func() { p.retry(interval) })
	}
	return p, nil
}

// retry syncs the last engines again every interval while some were left
// out, until the pool closes.
func (p *Pool) retry(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		if len(p.rejected) > 0 && !p.closed {
			// Under the lock from the check to the sync, so that a newer
			// Sync of the source never comes between them.
			p.syncLocked(p.ctx, p.last)
		}
		p.mu.Unlock()
	}
}

// Sync makes the pool's members the ready engines among engines: it adds
// the new ones, removes those gone or not ready, and re-adds those whose
// description changed. Invalid engines and engines that fail their block
// size check are left out (see Rejected).
func (p *Pool) Sync(ctx context.Context, engines []Engine) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	// The pool keeps copies: the caller may reuse its slices.
	p.last = make([]Engine, len(engines))
	for i := range engines {
		p.last[i] = engines[i].clone()
	}
	p.syncLocked(ctx, p.last)
}

// clone returns a copy of e that shares no slice with it.
func (e *Engine) clone() Engine {
	c := *e
	c.Ports, c.DynamoEvents = slices.Clone(e.Ports), slices.Clone(e.DynamoEvents)
	return c
}

// syncLocked is Sync with p.mu held; engines are the pool's own copies.
func (p *Pool) syncLocked(ctx context.Context, engines []Engine) {
	want := map[string]Engine{}
	clear(p.rejected)
	for _, e := range engines {
		if !e.Ready {
			continue
		}
		if e.ID == 0 {
			e.ID = WorkerIDOf(e.Name)
		}
		if err := e.Validate(); err != nil {
			p.reject(ctx, e.Name, err)
			continue
		}
		want[e.Name] = e
	}
	for name, m := range p.members {
		if e, ok := want[name]; !ok || !equalEngines(&e, &m.engine) {
			p.remove(ctx, m)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, ok := p.members[name]; !ok {
			e := want[name]
			if err := p.add(ctx, &e); err != nil {
				p.reject(ctx, name, err)
			}
		}
	}
}

func equalEngines(a, b *Engine) bool {
	return a.ID == b.ID && a.Host == b.Host && slices.Equal(a.Ports, b.Ports) && a.Events == b.Events &&
		a.Replay == b.Replay && a.Topic == b.Topic && a.Metrics == b.Metrics && a.Kind == b.Kind &&
		a.Ranks == b.Ranks && a.BlockSize == b.BlockSize && a.KVBlocks == b.KVBlocks && a.MaxRequests == b.MaxRequests &&
		a.MaxBatchedTokens == b.MaxBatchedTokens && a.Role == b.Role && slices.Equal(a.DynamoEvents, b.DynamoEvents)
}

func (p *Pool) reject(ctx context.Context, name string, err error) {
	p.rejected[name] = err
	p.log.WarnContext(ctx, "discovery: engine left out", "engine", name, "err", err)
}

// add registers e and starts its subscribers and scraper.
func (p *Pool) add(ctx context.Context, e *Engine) error {
	kind, _ := enginemetrics.ParseKind(e.Kind)
	ranks := e.RankCount()
	block := p.cfg.Router.Hasher().BlockSize()
	if e.BlockSize != 0 && e.BlockSize != block {
		return &enginemetrics.BlockSizeError{Worker: e.ID, Engine: e.BlockSize, Router: block}
	}
	if len(e.DynamoEvents) > 0 && p.cfg.DynamoEvents == nil {
		return fmt.Errorf("%w: %s: Dynamo event publishers but no PoolConfig.DynamoEvents", ErrEngine, e.Name)
	}
	target := enginemetrics.Target{Worker: e.ID, URL: e.Metrics, Kind: kind, Ranks: ranks}
	if p.cfg.Scraper != nil && e.Metrics != "" {
		if _, err := p.cfg.Scraper.Verify(ctx, target); err != nil {
			return err
		}
	}
	if p.cfg.Admit != nil {
		if err := p.cfg.Admit(ctx, e); err != nil {
			return err
		}
	}
	role, _ := ParseRole(e.Role)
	var w router.Worker = router.StaticWorker{WorkerID: e.ID, Ranks: ranks, Block: block, WorkerRole: role,
		BatchedTokens: e.MaxBatchedTokens, Requests: e.MaxRequests, CapacityBlocks: e.KVBlocks}
	if p.cfg.Worker != nil {
		w = p.cfg.Worker(e)
	}
	subs := make([]EventRunner, 0, len(e.Ports)+len(e.DynamoEvents))
	for _, dp := range e.DynamoEvents {
		sub, err := p.cfg.DynamoEvents(e, dp)
		if err != nil {
			return fmt.Errorf("%w: %s: Dynamo events at %s: %w", ErrEngine, e.Name, dp.Endpoint, err)
		}
		subs = append(subs, sub)
	}
	if e.Events != "" {
		for r := range e.Ports {
			sc := p.cfg.Subscriber
			sc.Endpoint, _ = RankEndpoint(e.Events, r)
			sc.ReplayEndpoint, _ = RankEndpoint(e.Replay, r)
			sc.Topic = e.Topic
			// A batch that carries no rank came from this endpoint's rank.
			sc.Converter.Worker, sc.Converter.Rank, sc.Converter.BlockSize = e.ID, kvroute.DPRank(r), block
			sc.Sink = p.cfg.Router.Index()
			sub, err := zmq.New(sc)
			if err != nil {
				return err
			}
			subs = append(subs, sub)
		}
	}
	if err := p.cfg.Router.AddWorker(w); err != nil {
		return err
	}
	if p.cfg.Addresses != nil {
		for r := range e.Ports {
			if err := p.cfg.Addresses.Set(kvroute.WorkerKey{ID: e.ID, Rank: kvroute.DPRank(r)}, e.Address(r)); err != nil {
				p.cfg.Addresses.DeleteWorker(e.ID)
				p.cfg.Router.RemoveWorker(e.ID)
				return err
			}
		}
	}
	mctx, cancel := context.WithCancel(p.ctx)
	m := &member{engine: e.clone(), cancel: cancel}
	for _, sub := range subs {
		m.done.Go(func() { _ = sub.Run(mctx) })
	}
	if p.cfg.Scraper != nil && e.Metrics != "" {
		m.done.Go(func() { _ = p.cfg.Scraper.Run(mctx, target) })
	}
	p.members[e.Name] = m
	p.log.InfoContext(ctx, "discovery: engine added", "engine", e.Name, "worker", uint64(e.ID), "ranks", ranks, "host", e.Host)
	return nil
}

// remove stops a member's goroutines first (so that no event re-registers
// its blocks), then unregisters it.
func (p *Pool) remove(ctx context.Context, m *member) {
	m.cancel()
	m.done.Wait()
	if p.cfg.Addresses != nil {
		p.cfg.Addresses.DeleteWorker(m.engine.ID)
	}
	p.cfg.Router.RemoveWorker(m.engine.ID)
	delete(p.members, m.engine.Name)
	p.log.InfoContext(ctx, "discovery: engine removed", "engine", m.engine.Name, "worker", uint64(m.engine.ID))
}

// Members returns the registered engines, sorted by name.
func (p *Pool) Members() []Engine {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Engine, 0, len(p.members))
	for _, name := range slices.Sorted(maps.Keys(p.members)) {
		out = append(out, p.members[name].engine.clone())
	}
	return out
}

// Rejected returns the engines the last Sync left out, with why.
func (p *Pool) Rejected() map[string]error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.rejected)
}

// Close removes every member and stops their goroutines. Later Syncs do
// nothing.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	for _, m := range p.members {
		p.remove(context.Background(), m)
	}
	p.end()
	p.mu.Unlock()
	p.retried.Wait()
	p.mu.Lock()
	return nil
}

// ParseEngine parses an engine given on a command line:
//
//	NAME=HOST:PORT[,ports=P1+P2+...][,events=ENDPOINT][,replay=ENDPOINT]
//	    [,topic=T][,metrics=URL][,kind=vllm|sglang][,id=N]
//
// for example "vllm-0=10.0.0.7:8000,events=tcp://10.0.0.7:5557,
// metrics=http://10.0.0.7:8000/metrics". ports lists every data-parallel
// rank's port (the first is HOST:PORT's). The engine is Ready. Errors wrap
// ErrEngine.
func ParseEngine(spec string) (Engine, error) {
	parts := strings.Split(spec, ",")
	name, addr, ok := strings.Cut(parts[0], "=")
	if !ok {
		return Engine{}, fmt.Errorf("%w: %q does not start with NAME=HOST:PORT", ErrEngine, spec)
	}
	host, port, err := net.SplitHostPort(strings.TrimSpace(addr))
	if err != nil {
		return Engine{}, fmt.Errorf("%w: %q: %w", ErrEngine, addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return Engine{}, fmt.Errorf("%w: port %q: %w", ErrEngine, port, err)
	}
	e := Engine{Name: strings.TrimSpace(name), Host: host, Ports: []int{p}, Ready: true}
	for _, opt := range parts[1:] {
		k, v, ok := strings.Cut(opt, "=")
		if !ok {
			return e, fmt.Errorf("%w: option %q is not key=value", ErrEngine, opt)
		}
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "ports":
			e.Ports = e.Ports[:0]
			for _, s := range strings.Split(v, "+") {
				n, err := strconv.Atoi(s)
				if err != nil {
					return e, fmt.Errorf("%w: ports: %w", ErrEngine, err)
				}
				e.Ports = append(e.Ports, n)
			}
		case "events":
			e.Events = v
		case "replay":
			e.Replay = v
		case "topic":
			e.Topic = v
		case "metrics":
			e.Metrics = v
		case "kind":
			e.Kind = v
		case "id":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return e, fmt.Errorf("%w: id: %w", ErrEngine, err)
			}
			e.ID = kvroute.WorkerID(n)
		default:
			return e, fmt.Errorf("%w: unknown option %q", ErrEngine, k)
		}
	}
	return e, e.Validate()
}
