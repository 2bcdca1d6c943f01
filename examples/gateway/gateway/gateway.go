package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/quickack"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/kvprom"
	kvzmq "github.com/kvroute/kvroute/kvevents/zmq"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// Errors returned by New, Run, AddEngine and the request path.
var (
	// ErrConfig is wrapped by New for an invalid Config.
	ErrConfig = errors.New("gateway: invalid configuration")
	// ErrRunning is returned by Run when the Gateway is already running.
	ErrRunning = errors.New("gateway: already running")
	// ErrDuplicateEngine is returned by AddEngine for an id already added.
	ErrDuplicateEngine = errors.New("gateway: engine already added")
	// ErrEngineGone is the outcome of an attempt whose engine was removed
	// between the routing decision and the request.
	ErrEngineGone = errors.New("gateway: engine removed")
)

// Config configures a Gateway. Zero fields take the defaults given.
type Config struct {
	// Router routes the requests; the gateway registers its engines in
	// it. Engines that publish KV events need a router in exact mode (the
	// default): their events are applied to Router.Index. Required.
	Router *router.Router
	// Engines are the engines to start with; AddEngine adds more.
	Engines []Engine
	// Frontend, when set, serves the workers registered in the router by
	// someone other than the gateway (a discovery source such as
	// discovery.Pool fed by package discovery/dynamo): their requests go
	// to Frontend.URL with Frontend's headers, templates expanded with
	// each worker's id and rank, as to NVIDIA Dynamo's frontend in
	// direct routing mode (Preset PresetDynamo). Its ID, events and
	// capacities are ignored. Run probes its URL like an engine's.
	Frontend *Engine
	// FrontendDPStart, when set, gives the start rank of a worker served
	// through Frontend whose data-parallel ranks do not start at 0 (its
	// instance id in, Dynamo's data_parallel_start_rank out): the "{rank}"
	// of Frontend's headers is then the router's rank plus it, the rank
	// Dynamo's frontend knows the worker's rank by (a worker of ranks 4 to
	// 7 is routed as ranks 0 to 3). It is called once per request sent
	// through Frontend and must not block; the DPStartRank method of
	// package kvevents/dynamo's subscribers is one. Nil adds nothing.
	FrontendDPStart func(worker uint64) int
	// Tokenizer turns prompts into the engines' token ids. Nil means
	// WordTokenizer, which agrees with no real model.
	Tokenizer Tokenizer
	// Adapters maps a request's model name to the LoRA adapter serving
	// it: the gateway sends the adapter's name to the engine and routes
	// on the adapter's cached blocks (router.Request.LoRA), which engines
	// keep apart from the base model's. A request naming an adapter
	// directly is routed as that adapter.
	Adapters map[string]string
	// Transport sends requests and health probes to the engines. Nil means
	// NewTransport().
	Transport http.RoundTripper
	// MaxAttempts is the number of engines a request is tried on before the
	// gateway gives up: it moves to another engine when one cannot be
	// reached, fails before its first streamed chunk, or answers 429 or
	// 5xx. Zero means 3.
	MaxAttempts int
	// MaxRequestBytes bounds a request body. Zero means 32 MiB.
	MaxRequestBytes int64
	// MaxResponseBytes bounds a non-streamed engine response, which the
	// gateway reads whole before relaying it; the client gets a 502 error
	// in place of a larger one (not retried: another engine would answer
	// as much). Zero means 64 MiB.
	MaxResponseBytes int64
	// HealthInterval is how often Run probes every engine's HealthPath:
	// a success is a router heartbeat, a failure a router error. It must
	// be below the router's HealthConfig.DegradedAfter. Zero means 2 s;
	// negative disables probing, and Run then only does the router's
	// timed housekeeping (Router.CheckHealth) every second.
	HealthInterval time.Duration
	// HealthTimeout bounds one probe. Zero means HealthInterval.
	HealthTimeout time.Duration
	// HealthPath is the engines' health endpoint. Empty means "/health"
	// (vLLM's and SGLang's).
	HealthPath string
	// RemoveAfter removes an engine (its subscribers stop and the router
	// forgets it and its blocks) once it has been unhealthy this long.
	// Zero means never: unhealthy engines stay registered and come back
	// when their probes succeed again.
	RemoveAfter time.Duration
	// EventIdleTimeout is the subscribers' kvzmq.Config.IdleTimeout. Zero
	// means kvzmq.DefaultIdleTimeout.
	EventIdleTimeout time.Duration
	// Subscribers, when set, is given each engine's KV-event subscribers
	// as engines are added (named by SubscriberName) and told to forget
	// them when an engine is removed; a *kvprom.Collector exports their
	// ingestion counters. Nil tells no one.
	Subscribers SubscriberSet
	// Clock supplies time to RemoveAfter. Nil means the system clock.
	Clock kvroute.Clock
	// Logger receives failed attempts and engine changes. Nil discards.
	Logger *slog.Logger
}

// SubscriberSet keeps the KV-event subscribers of the gateway's engines;
// *kvprom.Collector is one. Its methods are called while the gateway
// holds its lock: they must not block or call the Gateway.
type SubscriberSet interface {
	Add(name string, s kvprom.Source)
	Remove(name string)
}

// SubscriberName is the name an engine's subscriber of rank rank is given
// to Config.Subscribers: "ID/RANK", as in HeaderWorker.
func SubscriberName(id kvroute.WorkerID, rank int) string {
	return strconv.FormatUint(uint64(id), 10) + "/" + strconv.Itoa(rank)
}

// Gateway is an HTTP reverse proxy for OpenAI-compatible engines that
// routes every request with a kvroute router. It serves
// POST /v1/completions, POST /v1/chat/completions and GET /health.
//
// Concurrency: ServeHTTP, AddEngine, RemoveEngine and Stats are safe for
// concurrent use, whether or not Run is running.
type Gateway struct {
	r                 *router.Router
	tok               Tokenizer
	adapters          map[string]string // Config.Adapters, copied
	proxy             *httputil.ReverseProxy
	client            *http.Client
	transport         *http.Transport // the one New made, nil with Config.Transport
	maxAttempts       int
	maxReq, maxResp   int64
	interval, timeout time.Duration
	healthPath        string
	removeAfter       time.Duration
	idleTimeout       time.Duration
	clock             kvroute.Clock
	log               *slog.Logger
	subscribers       SubscriberSet // Config.Subscribers, nil without

	frontend        *engine                 // Config.Frontend, nil without
	frontendDPStart func(worker uint64) int // Config.FrontendDPStart

	// mu protects engines, removing, runCtx and active.
	mu      sync.RWMutex
	engines map[kvroute.WorkerID]*engine
	// removing holds, for each engine being removed (out of engines, not
	// yet out of the router), a channel closed when its removal is done.
	removing map[kvroute.WorkerID]chan struct{}
	runCtx   context.Context // Run's context, nil when Run is not running or stopping
	active   bool            // Run runs, until its subscribers have stopped

	requests, retries, failed atomic.Uint64
}

// engine is an added engine and its event subscribers.
type engine struct {
	cfg     Engine
	target  *url.URL
	headers engineHeaders       // compiled cfg.Headers and cfg.Preset
	subs    []*kvzmq.Subscriber // one per rank, none without Events

	// The fields below are protected by Gateway.mu.
	stop           context.CancelFunc // ends the running subscribers, nil when none run
	running        sync.WaitGroup     // the subscribers' goroutines
	unhealthySince time.Time          // zero while healthy
}

// New returns a Gateway for cfg with its engines registered in the router.
// It starts nothing: call Run for the event subscribers and health probes,
// and serve the Gateway with an http.Server.
func New(cfg Config) (*Gateway, error) {
	if cfg.Router == nil {
		return nil, fmt.Errorf("%w: no router", ErrConfig)
	}
	if cfg.MaxAttempts < 0 || cfg.MaxRequestBytes < 0 || cfg.MaxResponseBytes < 0 || cfg.HealthTimeout < 0 ||
		cfg.RemoveAfter < 0 || cfg.EventIdleTimeout < 0 {
		return nil, fmt.Errorf("%w: negative limit or duration", ErrConfig)
	}
	g := &Gateway{
		r:           cfg.Router,
		tok:         cfg.Tokenizer,
		adapters:    maps.Clone(cfg.Adapters),
		maxAttempts: cmp.Or(cfg.MaxAttempts, 3),
		maxReq:      cmp.Or(cfg.MaxRequestBytes, 32<<20),
		maxResp:     cmp.Or(cfg.MaxResponseBytes, 64<<20),
		interval:    cmp.Or(cfg.HealthInterval, 2*time.Second),
		healthPath:  cmp.Or(cfg.HealthPath, "/health"),
		removeAfter: cfg.RemoveAfter,
		idleTimeout: cfg.EventIdleTimeout,
		subscribers: cfg.Subscribers,
		clock:       kvroute.ClockOrSystem(cfg.Clock),
		log:         cfg.Logger,
		engines:     map[kvroute.WorkerID]*engine{},
	}
	g.timeout = cmp.Or(cfg.HealthTimeout, g.interval)
	if cfg.Frontend != nil {
		f := *cfg.Frontend
		f.Events, f.Replay = "", ""
		if err := f.Validate(); err != nil {
			return nil, fmt.Errorf("%w: frontend: %w", ErrConfig, err)
		}
		target, _ := url.Parse(f.URL) // validated
		headers, _ := f.headers()
		g.frontend = &engine{cfg: f, target: target, headers: headers}
		g.frontendDPStart = cfg.FrontendDPStart
	}
	if g.tok == nil {
		g.tok = WordTokenizer{}
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	transport := cfg.Transport
	if transport == nil {
		g.transport = NewTransport()
		transport = g.transport
	}
	g.client = &http.Client{Transport: transport}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:        g.rewrite,
		Transport:      transport,
		FlushInterval:  -1,
		ModifyResponse: g.modifyResponse,
		ErrorHandler:   g.proxyError,
		ErrorLog:       slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	for _, e := range cfg.Engines {
		if err := g.AddEngine(e); err != nil {
			for id := range g.engines {
				g.RemoveEngine(id)
			}
			return nil, err
		}
	}
	return g, nil
}

// NewTransport returns the transport a Gateway uses when Config.Transport
// is nil: one like http.DefaultTransport that keeps up to 256 idle
// connections per engine, and whose TCP connections acknowledge what they
// receive at once (on Linux, TCP_QUICKACK re-armed after every read). An
// engine or frontend that leaves Nagle's algorithm on, as NVIDIA Dynamo
// 1.6.1's frontend does, sends the first chunk of a streamed answer only
// once its response headers are acknowledged, and Linux delays that
// acknowledgement on a kept-alive connection by up to 40 ms: through a
// transport that does not acknowledge at once, a cached prompt's first
// token took 42–46 ms instead of 19 ms. A host that configures its own
// transport can start from this one.
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           quickack.DialContext(&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// Router returns the gateway's router.
func (g *Gateway) Router() *router.Router { return g.r }

// AddEngine registers e in the router and, while Run runs, starts its
// event subscribers. An engine of the same id being removed is removed
// first (AddEngine waits for it). It returns an error wrapping ErrEngineConfig for an
// invalid description, ErrDuplicateEngine for an id already added, and the
// router's error when it rejects the worker.
func (g *Gateway) AddEngine(e Engine) error {
	if err := e.Validate(); err != nil {
		return err
	}
	target, _ := url.Parse(e.URL) // validated
	headers, _ := e.headers()     // validated
	e.Headers = maps.Clone(e.Headers)
	eng := &engine{cfg: e, target: target, headers: headers}
	if e.Events != "" {
		for rank := range max(e.Ranks, 1) {
			ep, _ := rankEndpoint(e.Events, rank) // validated
			replay, _ := rankEndpoint(e.Replay, rank)
			sub, err := kvzmq.New(kvzmq.Config{
				Endpoint:       ep,
				ReplayEndpoint: replay,
				Topic:          e.Topic,
				// A batch that carries no rank came from this endpoint's rank.
				Converter: kvevents.ConverterConfig{Worker: e.ID, Rank: kvroute.DPRank(rank),
					BlockSize: g.r.Hasher().BlockSize(), Logger: g.log},
				Sink:        g.r.Index(),
				Logger:      g.log.With("engine", uint64(e.ID), "rank", rank),
				IdleTimeout: g.idleTimeout,
			})
			if err != nil {
				return fmt.Errorf("%w: engine %d: %w", ErrEngineConfig, e.ID, err)
			}
			eng.subs = append(eng.subs, sub)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		// An engine of this id on its way out is out first: the router
		// still has its worker until then.
		done, ok := g.removing[e.ID]
		if !ok {
			break
		}
		g.mu.Unlock()
		<-done
		g.mu.Lock()
	}
	if _, ok := g.engines[e.ID]; ok {
		return fmt.Errorf("%w: %d", ErrDuplicateEngine, e.ID)
	}
	err := g.r.AddWorker(router.StaticWorker{
		WorkerID: e.ID, Ranks: e.Ranks, Block: g.r.Hasher().BlockSize(),
		BatchedTokens: e.MaxBatchedTokens, Requests: e.MaxRequests, CapacityBlocks: e.KVCapacityBlocks,
	})
	if err != nil {
		return fmt.Errorf("gateway: engine %d: %w", e.ID, err)
	}
	g.engines[e.ID] = eng
	if g.subscribers != nil {
		for rank, sub := range eng.subs {
			g.subscribers.Add(SubscriberName(e.ID, rank), sub)
		}
	}
	if g.runCtx != nil {
		g.start(eng)
	}
	g.log.Info("engine added", "engine", uint64(e.ID), "url", e.URL, "events", e.Events)
	return nil
}

// start runs eng's subscribers under Run's context. g.mu is held.
func (g *Gateway) start(eng *engine) {
	ctx, cancel := context.WithCancel(g.runCtx)
	eng.stop = cancel
	for _, s := range eng.subs {
		eng.running.Go(func() { _ = s.Run(ctx) })
	}
}

// RemoveEngine stops engine id's subscribers and removes it from the
// router with its blocks. Requests in flight on it finish (or fail) on
// their own. It reports whether the engine was added.
func (g *Gateway) RemoveEngine(id kvroute.WorkerID) bool {
	return g.removeEngine(id, nil)
}

// removeEngine removes engine id, when it is expect (any engine of that id
// when expect is nil): a removal decided on an engine's state does not
// take away an engine added under its id since.
func (g *Gateway) removeEngine(id kvroute.WorkerID, expect *engine) bool {
	g.mu.Lock()
	eng, ok := g.engines[id]
	if !ok || expect != nil && eng != expect {
		g.mu.Unlock()
		return false
	}
	delete(g.engines, id)
	done := make(chan struct{})
	if g.removing == nil {
		g.removing = map[kvroute.WorkerID]chan struct{}{}
	}
	g.removing[id] = done
	if g.subscribers != nil {
		for rank := range eng.subs {
			g.subscribers.Remove(SubscriberName(id, rank))
		}
	}
	stop := eng.stop
	eng.stop = nil
	g.mu.Unlock()
	if stop != nil {
		stop()
	}
	// The subscribers must be done before the router drops the worker's
	// blocks, or a late event would register it in the index again.
	eng.running.Wait()
	g.r.RemoveWorker(id)
	g.mu.Lock()
	delete(g.removing, id)
	g.mu.Unlock()
	close(done)
	g.log.Info("engine removed", "engine", uint64(id))
	return true
}

// Run starts the engines' KV-event subscribers and the health probes
// (each round ends with the router's CheckHealth) and blocks until ctx
// ends; then it stops them, closes the idle connections of the transport
// New made (not those of Config.Transport) and returns nil. It returns
// ErrRunning when Run is running already or still stopping (its
// subscribers have not ended yet). Requests are served (by
// ServeHTTP) whether Run runs or not, but without it the router hears
// neither KV events nor heartbeats.
func (g *Gateway) Run(ctx context.Context) error {
	g.mu.Lock()
	if g.active {
		g.mu.Unlock()
		return ErrRunning
	}
	g.active = true
	g.runCtx = ctx
	for _, eng := range g.engines {
		g.start(eng)
	}
	g.mu.Unlock()

	// Without probes, the router's health still needs re-judging on
	// time: an engine unhealthy from errors is forgiven only by
	// CheckHealth (or a heartbeat or request, which it then gets none of).
	tick, check := g.interval, g.probe
	if tick <= 0 {
		tick, check = housekeepingInterval, func(context.Context) { g.r.CheckHealth() }
	}
	t := time.NewTicker(tick)
	for ctx.Err() == nil {
		check(ctx)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	t.Stop()

	g.mu.Lock()
	g.runCtx = nil
	var stopped []*engine
	for _, eng := range g.engines {
		if eng.stop != nil {
			eng.stop()
			eng.stop = nil
			stopped = append(stopped, eng)
		}
	}
	g.mu.Unlock()
	for _, eng := range stopped {
		eng.running.Wait()
	}
	if g.transport != nil {
		// The probes' connections, and those of requests served, would
		// otherwise stay open until the idle timeout; a request served
		// after Run connects again.
		g.transport.CloseIdleConnections()
	}
	g.mu.Lock()
	g.active = false
	g.mu.Unlock()
	return nil
}

// housekeepingInterval is how often Run calls the router's CheckHealth
// when it does not probe the engines.
const housekeepingInterval = time.Second

// probe checks every engine's health endpoint once, reports the results
// to the router and removes engines unhealthy for RemoveAfter. Each
// result goes to the worker probed (a router.Probe taken before the
// request): an engine removed and added again under its id meanwhile is
// not judged by its predecessor's answer.
func (g *Gateway) probe(ctx context.Context) {
	g.mu.RLock()
	engines := make([]*engine, 0, len(g.engines))
	for _, eng := range g.engines {
		engines = append(engines, eng)
	}
	g.mu.RUnlock()

	// Engines behind one URL (a shared frontend) are probed once.
	byURL := map[string][]kvroute.WorkerKey{}
	added := make(map[kvroute.WorkerID]bool, len(engines))
	for _, eng := range engines {
		u := eng.target.JoinPath(g.healthPath).String()
		for rank := range max(eng.cfg.Ranks, 1) {
			byURL[u] = append(byURL[u], kvroute.WorkerKey{ID: eng.cfg.ID, Rank: kvroute.DPRank(rank)})
		}
		added[eng.cfg.ID] = true
	}
	if g.frontend != nil {
		u := g.frontend.target.JoinPath(g.healthPath).String()
		byURL[u] = append(byURL[u], g.frontendWorkers(added)...)
	}
	var wg sync.WaitGroup
	for u, keys := range byURL {
		probes := make([]router.Probe, 0, len(keys))
		for _, key := range keys {
			if p, err := g.r.Probe(key); err == nil {
				probes = append(probes, p)
			}
		}
		if len(probes) == 0 {
			continue
		}
		wg.Go(func() {
			err := g.probeURL(ctx, u)
			for _, p := range probes {
				if err == nil {
					// Alive: the load stays what its source last said.
					_ = p.Alive()
				} else if ctx.Err() == nil {
					_ = p.Failed(err)
				}
			}
			if err != nil && ctx.Err() == nil {
				g.log.Debug("health probe failed", "url", u, "workers", len(keys), "err", err)
			}
		})
	}
	wg.Wait()
	g.r.CheckHealth()
	if g.removeAfter <= 0 || ctx.Err() != nil {
		return
	}
	now := g.clock.Now()
	var remove []*engine
	g.mu.Lock()
	for _, eng := range engines {
		if g.engines[eng.cfg.ID] != eng {
			continue // removed meanwhile
		}
		if !g.unhealthy(eng) {
			eng.unhealthySince = time.Time{}
			continue
		}
		if eng.unhealthySince.IsZero() {
			eng.unhealthySince = now
		}
		if now.Sub(eng.unhealthySince) >= g.removeAfter {
			remove = append(remove, eng)
		}
	}
	g.mu.Unlock()
	for _, eng := range remove {
		id := eng.cfg.ID
		g.log.Warn("removing engine unhealthy for too long", "engine", uint64(id), "after", g.removeAfter)
		if !g.removeEngine(id, eng) {
			g.log.Info("engine unhealthy for too long was removed or replaced meanwhile", "engine", uint64(id))
		}
	}
}

// frontendWorkers returns the router's cache domains whose worker was not
// added to the gateway (added holds those that were): the Frontend's.
func (g *Gateway) frontendWorkers(added map[kvroute.WorkerID]bool) []kvroute.WorkerKey {
	var keys []kvroute.WorkerKey
	for _, k := range g.r.Workers() {
		if !added[k.ID] {
			keys = append(keys, k)
		}
	}
	return keys
}

// unhealthy reports whether every rank of eng is unhealthy.
func (g *Gateway) unhealthy(eng *engine) bool {
	for rank := range max(eng.cfg.Ranks, 1) {
		if h, ok := g.r.Health(kvroute.WorkerKey{ID: eng.cfg.ID, Rank: kvroute.DPRank(rank)}); ok && h != router.Unhealthy {
			return false
		}
	}
	return true
}

// probeURL sends one health probe.
func (g *Gateway) probeURL(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("health probe: %s", resp.Status)
	}
	return nil
}

// Heartbeat passes a load report of one cache domain from a load source
// (an enginemetrics.Scraper, Dynamo's load events) to the router, which
// keeps it: the gateway's health probes say an engine is alive, never
// what it carries, and leave the last report as it is. With Hasher, it
// makes the Gateway an enginemetrics.Reporter. It returns the router's
// ErrUnknownWorker for a domain not added.
func (g *Gateway) Heartbeat(w kvroute.WorkerKey, load scheduling.Load) error {
	return g.r.Heartbeat(w, load)
}

// Hasher returns the router's hasher.
func (g *Gateway) Hasher() kvroute.Hasher { return g.r.Hasher() }

// EngineStats is one engine's state in Stats.
type EngineStats struct {
	// Engine is the engine's description.
	Engine Engine
	// Health is the router's view of each rank.
	Health []router.Health
	// Events are its subscribers' counters, summed over ranks.
	Events kvzmq.Stats
}

// Stats counts what the gateway did. It is plain data.
type Stats struct {
	// Requests is the number of routed requests received.
	Requests uint64
	// Retries is the number of attempts after a request's first.
	Retries uint64
	// Failed is the number of requests the gateway answered with an error
	// of its own or an engine's error after every attempt failed.
	Failed uint64
	// Engines are the added engines, by id.
	Engines []EngineStats
	// Frontend are the workers served through Config.Frontend (those a
	// discovery source registered in the router), by id: Engine holds
	// their id and the frontend's URL and headers; they have no events
	// of the gateway's.
	Frontend []EngineStats
}

// Stats returns a snapshot of the gateway's counters.
func (g *Gateway) Stats() Stats {
	st := Stats{Requests: g.requests.Load(), Retries: g.retries.Load(), Failed: g.failed.Load()}
	g.mu.RLock()
	for _, eng := range g.engines {
		es := EngineStats{Engine: eng.cfg}
		for rank := range max(eng.cfg.Ranks, 1) {
			h, _ := g.r.Health(kvroute.WorkerKey{ID: eng.cfg.ID, Rank: kvroute.DPRank(rank)})
			es.Health = append(es.Health, h)
		}
		for _, s := range eng.subs {
			es.Events = addStats(es.Events, s.Stats())
		}
		st.Engines = append(st.Engines, es)
	}
	if g.frontend != nil {
		added := make(map[kvroute.WorkerID]bool, len(g.engines))
		for id := range g.engines {
			added[id] = true
		}
		byID := map[kvroute.WorkerID]*EngineStats{}
		for _, ws := range g.r.Stats().Workers {
			if added[ws.Worker.ID] {
				continue
			}
			es := byID[ws.Worker.ID]
			if es == nil {
				e := g.frontend.cfg
				e.ID = ws.Worker.ID
				es = &EngineStats{Engine: e}
				byID[ws.Worker.ID] = es
			}
			es.Engine.Ranks = max(es.Engine.Ranks, int(ws.Worker.Rank)+1)
			for len(es.Health) <= int(ws.Worker.Rank) {
				es.Health = append(es.Health, router.Unhealthy)
			}
			es.Health[ws.Worker.Rank] = ws.Health
		}
		for _, es := range byID {
			st.Frontend = append(st.Frontend, *es)
		}
	}
	g.mu.RUnlock()
	for _, list := range [][]EngineStats{st.Engines, st.Frontend} {
		slices.SortFunc(list, func(a, b EngineStats) int { return cmp.Compare(a.Engine.ID, b.Engine.ID) })
	}
	return st
}

func addStats(a, b kvzmq.Stats) kvzmq.Stats {
	a.Received += b.Received
	a.Replayed += b.Replayed
	a.Applied += b.Applied
	a.Gaps += b.Gaps
	a.Dropped += b.Dropped
	a.Duplicates += b.Duplicates
	a.Malformed += b.Malformed
	a.ApplyErrs += b.ApplyErrs
	a.Restarts += b.Restarts
	a.Reconnects += b.Reconnects
	return a
}
