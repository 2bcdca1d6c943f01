package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// Config configures a simulated cluster.
type Config struct {
	// Workers is the number of engines. Zero means 4.
	Workers int
	// BlockSize is the engines' (and the router's) KV block size in tokens.
	// Zero means kvroute.DefaultBlockSize.
	BlockSize int
	// Engine describes every engine.
	Engine EngineConfig
	// EventDelay is how long an engine's KV event batch takes to reach the
	// router's index, and its load report to reach Router.Heartbeat: the
	// staleness of the router's view. Zero means 20 ms; negative means
	// none.
	EventDelay time.Duration
	// HeartbeatInterval is how often engines report their load (queue
	// depth, running requests, KV-cache utilisation) and the router checks
	// health. Zero means 1 s; negative disables load reports.
	HeartbeatInterval time.Duration
	// Concurrency, when positive, makes the clients a closed loop: at most
	// Concurrency requests are in the cluster at once, and a request
	// arrives at its Arrival or when a request finishes and leaves room,
	// whichever is later, in workload order, as when Concurrency clients
	// each send their next request once their last one has finished. Zero
	// means the workload's arrival times alone (an open loop).
	Concurrency int
	// Seed seeds the router's selector. Runs with equal configurations,
	// workloads and policies give equal results.
	Seed uint64
	// Progress, when set, is called with the number of finished requests
	// about every 1% of the workload, on the goroutine that runs the
	// simulation.
	Progress func(done, total int)
	// Logger receives a debug record per run. Nil discards.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	setDefault(&c.Workers, 4)
	setDefault(&c.BlockSize, kvroute.DefaultBlockSize)
	if c.EventDelay == 0 {
		c.EventDelay = 20 * time.Millisecond
	} else if c.EventDelay < 0 {
		c.EventDelay = 0
	}
	setDefault(&c.HeartbeatInterval, time.Second)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Engine = c.Engine.withDefaults()
	return c
}

// virtualClock is the simulation's clock: a fixed epoch plus the virtual
// time of the event being processed.
type virtualClock struct {
	epoch time.Time
	now   time.Duration
}

func (c *virtualClock) Now() time.Time { return c.epoch.Add(c.now) }

// epoch is the virtual start of every run.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// sim is the state of one run. It runs on one goroutine.
type sim struct {
	cfg     Config
	wl      *Workload
	policy  Policy
	clock   virtualClock
	router  *router.Router
	index   kvevents.Sink
	engines []*engine
	events  eventHeap

	// Ingest path, one converter and event counter per engine.
	batch     kvevents.Batch
	convs     []*kvevents.Converter
	converted []kvroute.Event
	nextID    []uint64
	payloads  [][]byte // free payload buffers

	tokens   []uint32 // materialised prompt of the request being routed
	free     []*simReq
	deferred []*simReq // requests the router found every worker busy for, FIFO

	reportGen []uint64 // per engine: load reports received (Policy.FreshLoad)

	// Measurements.
	ttft, latency, selects []time.Duration
	done                   int
	promptTokens, cached   int64
	outputTokens           int64
	deferrals              int
	lastLoadAt             time.Duration
	maxArea, meanArea      float64
	activeArea             []float64 // per engine
	ev                     EventStats
}

// Run simulates workload wl on a cluster configured by cfg, routed by
// policy p, and returns the measurements. It returns an error wrapping
// ErrInvalidConfig for a bad configuration, the router's error when a
// request cannot be routed for another reason than every worker being busy,
// and ctx's error when ctx ends first.
func Run(ctx context.Context, cfg Config, wl *Workload, p Policy) (Result, error) {
	cfg = cfg.withDefaults()
	if cfg.Workers < 1 || cfg.Workers > 1<<16 {
		return Result{}, fmt.Errorf("%w: %d workers", ErrInvalidConfig, cfg.Workers)
	}
	if cfg.Concurrency < 0 {
		return Result{}, fmt.Errorf("%w: concurrency %d", ErrInvalidConfig, cfg.Concurrency)
	}
	if err := cfg.Engine.validate(); err != nil {
		return Result{}, err
	}
	if p.Configure == nil {
		return Result{}, fmt.Errorf("%w: policy %q has no Configure", ErrInvalidConfig, p.Name)
	}
	h, err := kvroute.NewHasher(kvroute.HasherConfig{BlockSize: cfg.BlockSize})
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	s := &sim{cfg: cfg, wl: wl, policy: p, clock: virtualClock{epoch: epoch}}
	rc, err := p.Configure(&s.clock)
	if err != nil {
		return Result{}, fmt.Errorf("bench: policy %s: %w", p.Name, err)
	}
	rc.Hasher, rc.Clock, rc.Index = h, &s.clock, nil
	if rc.Selector.Seed == 0 {
		rc.Selector.Seed = cfg.Seed*0x9e3779b97f4a7c15 + 1
	}
	if s.router, err = router.New(rc); err != nil {
		return Result{}, fmt.Errorf("bench: policy %s: %w", p.Name, err)
	}
	if !rc.Approximate {
		s.index = s.router.Index()
	}
	for i := range cfg.Workers {
		id := kvroute.WorkerID(i + 1)
		err := s.router.AddWorker(router.StaticWorker{
			WorkerID: id, Block: cfg.BlockSize,
			BatchedTokens: cfg.Engine.MaxBatchedTokens, Requests: cfg.Engine.MaxBatch, CapacityBlocks: cfg.Engine.CacheBlocks,
		})
		if err != nil {
			return Result{}, fmt.Errorf("bench: add worker: %w", err)
		}
		conv, err := kvevents.NewConverter(kvevents.ConverterConfig{Worker: id, BlockSize: cfg.BlockSize})
		if err != nil {
			return Result{}, fmt.Errorf("bench: converter: %w", err)
		}
		s.engines = append(s.engines, newEngine(id, cfg.Engine, h))
		s.convs = append(s.convs, conv)
	}
	s.nextID = make([]uint64, cfg.Workers)
	s.reportGen = make([]uint64, cfg.Workers)
	s.activeArea = make([]float64, cfg.Workers)
	n := len(wl.Requests)
	s.ttft = make([]time.Duration, 0, n)
	s.latency = make([]time.Duration, 0, n)
	s.selects = make([]time.Duration, 0, n)

	start := time.Now()
	if err := s.loop(ctx); err != nil {
		return Result{}, err
	}
	res := s.result()
	res.WallTime = time.Since(start)
	cfg.Logger.Debug("simulation done", slog.String("workload", wl.Name), slog.String("policy", p.Name),
		slog.Float64("hit_rate", res.HitRate), slog.Duration("wall", res.WallTime))
	return res, nil
}

// loop runs the discrete-event loop until every request has finished.
func (s *sim) loop(ctx context.Context) error {
	reqs := s.wl.Requests
	total := len(reqs)
	step := max(total/100, 1)
	if s.cfg.HeartbeatInterval > 0 && total > 0 {
		s.events.push(simEvent{at: s.cfg.HeartbeatInterval, kind: evTick})
	}
	next := 0
	for iter := 0; s.done < total; iter++ {
		if iter&1023 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
		}
		if at, ok := s.arrival(next); ok && (s.events.len() == 0 || at <= s.events.peek().at) {
			r := &reqs[next]
			next++
			s.advance(at)
			if err := s.arrive(ctx, r); err != nil {
				return err
			}
			continue
		}
		if s.events.len() == 0 {
			return fmt.Errorf("bench: simulation stalled with %d of %d requests unfinished", total-s.done, total)
		}
		ev := s.events.pop()
		s.advance(ev.at)
		before := s.done
		if err := s.handle(ctx, &ev, next < total); err != nil {
			return err
		}
		if s.cfg.Progress != nil && s.done/step != before/step {
			s.cfg.Progress(s.done, total)
		}
	}
	return nil
}

// arrival returns when the workload's request i arrives, and false when
// it cannot arrive yet: none is left, or Config.Concurrency requests are in
// the cluster. A request arrives at its Arrival, or now if that has passed
// while it waited for room.
func (s *sim) arrival(i int) (time.Duration, bool) {
	if i >= len(s.wl.Requests) || s.cfg.Concurrency > 0 && i-s.done >= s.cfg.Concurrency {
		return 0, false
	}
	return max(s.wl.Requests[i].Arrival, s.clock.now), true
}

// advance moves virtual time to t, integrating the load imbalance.
func (s *sim) advance(t time.Duration) {
	if dt := float64(t - s.lastLoadAt); dt > 0 {
		peak, sum := 0, 0
		for i, e := range s.engines {
			a := e.active()
			peak = max(peak, a)
			sum += a
			s.activeArea[i] += dt * float64(a)
		}
		s.maxArea += dt * float64(peak)
		s.meanArea += dt * float64(sum) / float64(len(s.engines))
		s.lastLoadAt = t
	}
	s.clock.now = t
}

// arrive routes a new request.
func (s *sim) arrive(ctx context.Context, w *Request) error {
	var r *simReq
	if k := len(s.free); k > 0 {
		r = s.free[k-1]
		s.free = s.free[:k-1]
	} else {
		r = new(simReq)
	}
	r.w = w
	r.arrival = s.clock.now
	r.promptLen = w.Prompt.Len()
	r.outputLen = max(w.Output.Len, 1)
	if len(s.deferred) > 0 {
		// Earlier requests wait for room: keep arrival order.
		s.deferred = append(s.deferred, r)
		s.deferrals++
		return nil
	}
	ok, err := s.route(ctx, r)
	if err != nil {
		return err
	}
	if !ok {
		s.deferred = append(s.deferred, r)
		s.deferrals++
	}
	return nil
}

// route asks the router for r's worker and hands r to that engine. It
// reports false when every worker is busy.
func (s *sim) route(ctx context.Context, r *simReq) (bool, error) {
	s.tokens = r.w.Prompt.AppendTokens(s.tokens[:0])
	req := router.Request{Tokens: s.tokens}
	if s.policy.SessionAffinity {
		req.SessionKey = r.w.Session
	}
	t0 := time.Now()
	err := s.router.SelectInto(ctx, &req, &r.dec)
	s.selects = append(s.selects, time.Since(t0))
	if err != nil {
		if errors.Is(err, scheduling.ErrAllBusy) {
			return false, nil
		}
		return false, fmt.Errorf("bench: route request: %w", err)
	}
	i := int(r.dec.Worker.ID) - 1
	if i < 0 || i >= len(s.engines) {
		return false, fmt.Errorf("bench: router chose unknown worker %s", r.dec.Worker)
	}
	r.routed = s.clock.now
	e := s.engines[i]
	e.enqueue(r, s.tokens)
	s.kick(e)
	return true, nil
}

// retryDeferred routes held requests, oldest first, until the router
// finds every worker busy again.
func (s *sim) retryDeferred(ctx context.Context) error {
	for len(s.deferred) > 0 {
		ok, err := s.route(ctx, s.deferred[0])
		if err != nil || !ok {
			return err
		}
		s.deferred[0] = nil
		s.deferred = s.deferred[1:]
	}
	return nil
}

// kick starts a step on an idle engine that has work.
func (s *sim) kick(e *engine) {
	if e.busy {
		return
	}
	d, ok := e.startStep()
	s.flush(e)
	if !ok {
		return
	}
	e.busy = true
	s.events.push(simEvent{at: s.clock.now + d, kind: evStepDone, engine: int(e.id) - 1})
}

// flush publishes an engine's pending KV events as one encoded batch that
// reaches the router after the event delay.
func (s *sim) flush(e *engine) {
	var buf []byte
	if k := len(s.payloads); k > 0 {
		buf = s.payloads[k-1][:0]
		s.payloads = s.payloads[:k-1]
	}
	out, err := e.flushEvents(buf, s.clock.now)
	if err != nil {
		s.ev.EncodeErrors++
		return
	}
	if len(out) == 0 {
		if buf != nil {
			s.payloads = append(s.payloads, buf)
		}
		return
	}
	s.ev.Batches++
	s.ev.Bytes += int64(len(out))
	s.events.push(simEvent{at: s.clock.now + s.cfg.EventDelay, kind: evKVEvents, engine: int(e.id) - 1, payload: out})
}

// handle processes one scheduled event. arrivalsLeft reports whether
// requests are still to arrive (load reports go on until the end).
func (s *sim) handle(ctx context.Context, ev *simEvent, arrivalsLeft bool) error {
	switch ev.kind {
	case evStepDone:
		e := s.engines[ev.engine]
		e.busy = false
		freed := false
		e.finishStep(
			func(r *simReq) {
				r.firstToken = s.clock.now
				s.ttft = append(s.ttft, r.firstToken-r.arrival)
				r.dec.PrefillDone()
				r.dec.AddOutputTokens(1)
				freed = true
			},
			func(r *simReq) { r.dec.AddOutputTokens(1) },
			func(r *simReq) { s.complete(r); freed = true },
		)
		s.kick(e)
		if freed && len(s.deferred) > 0 {
			return s.retryDeferred(ctx)
		}
	case evKVEvents:
		s.deliver(ev)
	case evHeartbeat:
		load := s.policy.TakenReport(ev.load)
		if !s.policy.OwnLoad && s.policy.FreshLoad > 0 {
			s.reportGen[ev.engine]++
			s.events.push(simEvent{at: s.clock.now + s.policy.FreshLoad, kind: evLoadStale, engine: ev.engine,
				load: load.Capacities(), gen: s.reportGen[ev.engine]})
		}
		if err := s.router.Heartbeat(kvroute.WorkerKey{ID: kvroute.WorkerID(ev.engine + 1)}, load); err != nil {
			return fmt.Errorf("bench: heartbeat: %w", err)
		}
	case evLoadStale:
		if ev.gen != s.reportGen[ev.engine] {
			return nil // a newer report arrived
		}
		if err := s.router.Heartbeat(kvroute.WorkerKey{ID: kvroute.WorkerID(ev.engine + 1)}, ev.load); err != nil {
			return fmt.Errorf("bench: heartbeat: %w", err)
		}
	case evTick:
		s.router.CheckHealth()
		for i, e := range s.engines {
			s.events.push(simEvent{at: s.clock.now + s.cfg.EventDelay, kind: evHeartbeat, engine: i, load: e.load()})
		}
		if arrivalsLeft || s.done < len(s.wl.Requests) {
			s.events.push(simEvent{at: s.clock.now + s.cfg.HeartbeatInterval, kind: evTick})
		}
	}
	return nil
}

// complete records a finished request and ends its decision.
func (s *sim) complete(r *simReq) {
	r.dec.Done(router.Outcome{CachedTokens: r.cachedTokens, CachedTokensKnown: true})
	s.latency = append(s.latency, s.clock.now-r.arrival)
	s.done++
	s.promptTokens += int64(r.promptLen)
	s.cached += int64(r.cachedTokens)
	s.outputTokens += int64(r.outputLen)
	r.w, r.engine = nil, nil
	s.free = append(s.free, r)
}

// deliver decodes a KV event batch, converts it and applies it to the
// router's index, numbering each engine's events as a ZMQ publisher does.
func (s *sim) deliver(ev *simEvent) {
	defer func() { s.payloads = append(s.payloads, ev.payload) }()
	if s.index == nil {
		return
	}
	if err := kvevents.DecodeBatch(ev.payload, &s.batch); err != nil {
		s.ev.DecodeErrors++
		return
	}
	var err error
	s.converted, err = s.convs[ev.engine].Convert(s.converted[:0], &s.batch)
	if err != nil {
		s.ev.DecodeErrors++
		return
	}
	for i := range s.converted {
		e := &s.converted[i]
		s.nextID[ev.engine]++
		e.ID = s.nextID[ev.engine]
		if err := s.index.Apply(e); err != nil {
			s.ev.ApplyErrors++
		}
		s.ev.Events++
	}
}

// load is the engine's load report.
func (e *engine) load() scheduling.Load {
	return scheduling.Load{
		ActiveRequests:   e.active(),
		QueueDepth:       len(e.waiting),
		MaxRequests:      e.cfg.MaxBatch,
		KVUtilization:    min(float64(e.cache.pinned())/float64(max(e.cache.capacity, 1)), 1),
		KVCapacityBlocks: e.cfg.CacheBlocks,
		MaxBatchedTokens: e.cfg.MaxBatchedTokens,
	}
}

// result summarises the run.
func (s *sim) result() Result {
	res := Result{
		Workload:     s.wl.Name,
		Policy:       s.policy.Name,
		Workers:      len(s.engines),
		Requests:     s.done,
		PromptTokens: s.promptTokens,
		CachedTokens: s.cached,
		OutputTokens: s.outputTokens,
		Duration:     s.clock.now,
		TTFT:         summarize(s.ttft),
		Latency:      summarize(s.latency),
		Select:       summarize(s.selects),
		Deferrals:    s.deferrals,
		Events:       s.ev,
	}
	if s.promptTokens > 0 {
		res.HitRate = float64(s.cached) / float64(s.promptTokens)
	}
	if secs := s.clock.now.Seconds(); secs > 0 {
		res.Throughput = float64(s.done) / secs
		res.OutputTokensPerSecond = float64(s.outputTokens) / secs
	}
	if s.meanArea > 0 {
		res.PeakImbalance = s.maxArea / s.meanArea
		res.ActivePerWorker = make([]float64, len(s.activeArea))
		peak := 0.0
		for i, a := range s.activeArea {
			res.ActivePerWorker[i] = a / float64(s.clock.now)
			peak = max(peak, a)
		}
		// meanArea is the integral of the mean engine's load, which is
		// also the mean of the engines' integrals.
		res.LoadImbalance = peak / s.meanArea
	}
	st := s.router.Stats()
	res.PredictedHitRate = st.PredictedHitRate
	res.RoutingAccuracy = st.Accuracy
	for _, e := range s.engines {
		res.Events.StoredBlocks += e.stored
		res.Events.RemovedBlocks += e.removed
	}
	return res
}

// summarize returns the mean and quantiles of ds, sorting it in place.
func summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	slices.Sort(ds)
	var sum float64
	for _, d := range ds {
		sum += float64(d)
	}
	q := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(ds)))) - 1
		return ds[min(max(i, 0), len(ds)-1)]
	}
	return Summary{Mean: time.Duration(sum / float64(len(ds))), P50: q(0.50), P99: q(0.99), Max: ds[len(ds)-1]}
}
