package dynamo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/internal/zmqdial"
	"github.com/kvroute/kvroute/kvevents"
)

// Errors returned by New, AddPublisher and Run.
var (
	// ErrConfig is wrapped for an invalid Config or Publisher.
	ErrConfig = errors.New("dynamo: invalid configuration")
	// ErrRunning is returned by Run when the Subscriber is already running.
	ErrRunning = errors.New("dynamo: subscriber already running")
)

// Defaults of Config's durations.
const (
	DefaultDialTimeout = 2 * time.Second
	DefaultMaxBackoff  = 5 * time.Second
	// DefaultRecoveryGiveUp is Config.RecoveryGiveUp's default.
	DefaultRecoveryGiveUp = time.Minute
	minBackoff            = 50 * time.Millisecond
	// queueLen is the number of received messages buffered between the
	// sockets and the loop that applies them.
	queueLen = 1024
)

// Config configures a Subscriber.
type Config struct {
	// Sink receives the events of "kv-events" publishers, numbered
	// consecutively per worker: an *indexer.Index, or a relay. It is
	// called from Run's goroutine only. Nil skips kv-events.
	Sink kvevents.Sink
	// Load receives a heartbeat per "kv_metrics" or
	// "forward-pass-metrics" message (see LoadOf): a *router.Router. It is
	// called from Run's goroutine only. Nil skips those topics. Sink or
	// Load is required.
	Load LoadReporter
	// Logger receives records of gaps, restarts, malformed messages and
	// reconnects. Nil discards.
	Logger *slog.Logger
	// IdleTimeout, when positive, is how long a connection may stay
	// silent before the subscriber reconnects it. Zero or negative never
	// reconnects an idle connection, the default: a publisher that exits
	// closes its connection, and the subscriber reconnects at once (with
	// backoff), and connections are dialed with TCP keep-alive (Go's
	// defaults: probes after 15 s of silence, every 15 s, 9 of them), which
	// ends a connection whose host went away without closing it. A
	// reconnect may lose the messages sent while it happens (they show as
	// a gap), and a worker's kv-events are silent while it serves nothing.
	IdleTimeout time.Duration
	// DialTimeout bounds each connection attempt. Zero means
	// DefaultDialTimeout.
	DialTimeout time.Duration
	// MaxBackoff bounds the wait between connection attempts. Zero means
	// DefaultMaxBackoff.
	MaxBackoff time.Duration
	// Query configures the worker KV queries of publishers with a
	// Recovery target.
	Query Querier
	// RecoveryGiveUp is how long the subscriber retries the recovery of a
	// worker whose queries fail (see Subscriber) before it gives up on it
	// (Stats.Abandoned). Zero means DefaultRecoveryGiveUp.
	RecoveryGiveUp time.Duration
}

// Publisher is one ZMQ PUB socket of Dynamo's event plane: a
// v1/event_channels record.
type Publisher struct {
	// Endpoint is the publisher's ZMQ endpoint (the record's
	// transport.config.endpoint), such as "tcp://127.0.0.1:44351".
	// Required; it identifies the publisher in RemovePublisher.
	Endpoint string
	// Topic is the topic to subscribe to (the record's topic): TopicKVEvents,
	// TopicKVMetrics or TopicForwardPassMetrics. Empty receives every topic
	// the socket sends.
	Topic string
	// KVCapacityBlocks is the worker's KV cache size in blocks (the model
	// card's runtime_config.total_kv_blocks), for the load reports of
	// kv_metrics; zero when unknown.
	KVCapacityBlocks int
	// BlockSize is the worker's KV block size (the model card's
	// kv_cache_block_size), for the load reports of forward-pass-metrics;
	// zero when unknown.
	BlockSize int
	// MaxRequests and MaxBatchedTokens are the engine's request slots and
	// token budget per step (the model card's runtime_config.max_num_seqs
	// and max_num_batched_tokens), copied into the load reports; zero
	// when unknown.
	MaxRequests, MaxBatchedTokens int
	// Recovery is the worker's KV query endpoint for a kv-events
	// publisher (its v1/event_sources record's metadata.recovery_target,
	// see ParseRecoveryTarget), or nil. With it the subscriber restores
	// the worker's cache when it first hears from it and fetches the
	// events lost in a gap, as Dynamo's router does (see Subscriber).
	Recovery *RecoveryTarget
}

// Subscriber applies what Dynamo workers publish on the ZMQ event plane
// (one PUB socket per worker and topic, discovered in v1/event_channels)
// to an index and a router: RouterEvents of "kv-events" go to Config.Sink,
// "kv_metrics" and "forward-pass-metrics" become heartbeats on
// Config.Load.
//
// Each message is [topic, publisher id, sequence, data] (see DecodeZMQ).
// The worker is named by the payload: a RouterEvent's worker_id (the
// worker's instance id) and dp_rank are the kvroute.WorkerKey, so the
// host registers workers under their instance ids. Dynamo numbers ranks
// across the deployment: a worker whose model card has
// data_parallel_start_rank S and data_parallel_size N serves ranks S to
// S+N-1, while the router models its ranks as 0 to N-1. Give such
// workers' start ranks to SetDPStartRanks before adding their publishers:
// rank R of the worker is then the kvroute.WorkerKey rank R-S (the
// recovery target keeps Dynamo's rank R, which the worker's queries
// take).
//
// Sequence handling, per publisher id: the first message from a publisher
// is accepted whatever its number. A number one above the last is
// applied. A jump is a gap: it is counted (Stats.Gaps, Stats.Lost) and the
// message applied; nothing is reset, because a reset would drop every
// valid block of the worker for the sake of a few events. A number not
// above the last is a duplicate and skipped, except 0, which means the
// publisher restarted: the workers it reported are reset.
//
// Recovery, for a kv-events publisher given its worker's query endpoint
// (Publisher.Recovery, from v1/event_sources: workers with a local
// indexer serve one on Dynamo's TCP request plane; see Querier), follows
// Dynamo's router: the subscriber keeps the worker's last RouterEvent
// event_id; on first hearing from the worker it asks for a dump of the
// worker's whole cache (reset, then applied), skipping the live events the
// dump already holds; on a jump in event ids it asks for the events from
// the first missing one and applies those before the live event; a clear
// is a barrier. When a publisher with a recovery target is added, the
// subscriber asks for the dump at once, so that a worker idle since then is
// known before it publishes again. Queries run on goroutines of their own:
// while a worker's query is under way, that worker's live events wait
// (for at most Config.Query.Timeout) and are applied in order after its
// answer; other workers' events are applied meanwhile. A query that fails
// is counted (Stats.QueryErrs), the waiting events are applied as without
// recovery (the events of a gap counted in Stats.LostEvents), and the
// subscriber retries in the background with a dump (after 0.5 s, doubling
// up to 10 s; the worker's events are applied meanwhile and applied again
// after the dump), until the queries have failed for
// Config.RecoveryGiveUp: it then gives up on the worker
// (Stats.Abandoned), which is followed as without recovery until its
// publisher is added again.
//
// Without recovery, what lost messages carried is lost until the worker
// reports those blocks again: blocks they stored are missing from the
// index (and later stores whose parent is one of them are refused by the
// index, counted in Stats.UnknownParents, until the prefix is stored
// anew), blocks they removed stay indexed (predicted hits the worker no
// longer has) until the worker clears its cache; and what the worker
// cached before the subscriber joined is unknown until stored again.
//
// A message that does not decode is counted in Stats.Malformed and
// skipped; it never resets a worker. A kv-events message whose envelope
// decodes but whose payload does not still counts in its publisher's
// sequence: when that shows a restart, the publisher's workers are reset
// (their old blocks are gone from the engine) and their events awaited
// anew.
//
// A Subscriber does nothing until the host calls Run, and stops when Run's
// context ends; AddPublisher, RemovePublisher and Stats may be called from
// any goroutine, before or during Run.
type Subscriber struct {
	cfg     Config
	log     *slog.Logger
	stats   counters
	running atomic.Bool
	// sessions numbers the connections made (see inbound.session).
	sessions atomic.Uint64

	pubs   followed[Publisher] // the publishers to follow, by endpoint
	starts dpStarts            // data_parallel_start_rank by worker
}

// New returns a Subscriber for cfg. It returns an error wrapping ErrConfig
// when neither Sink nor Load is set or a duration is negative where it
// may not be. It connects to nothing.
func New(cfg Config) (*Subscriber, error) {
	if cfg.Sink == nil && cfg.Load == nil {
		return nil, fmt.Errorf("%w: neither Sink nor Load", ErrConfig)
	}
	if cfg.DialTimeout < 0 || cfg.MaxBackoff < 0 || cfg.RecoveryGiveUp < 0 {
		return nil, fmt.Errorf("%w: negative DialTimeout, MaxBackoff or RecoveryGiveUp", ErrConfig)
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Subscriber{
		cfg:  cfg,
		log:  log,
		pubs: newFollowed[Publisher](),
	}, nil
}

// AddPublisher makes the subscriber follow p (replacing an earlier
// Publisher with the same endpoint). It returns an error wrapping
// ErrConfig when the endpoint is empty or a count is negative.
func (s *Subscriber) AddPublisher(p Publisher) error {
	if p.Endpoint == "" {
		return fmt.Errorf("%w: publisher without endpoint", ErrConfig)
	}
	if err := checkLimits(p.KVCapacityBlocks, p.BlockSize, p.MaxRequests, p.MaxBatchedTokens); err != nil {
		return err
	}
	s.pubs.put(p.Endpoint, p)
	return nil
}

// RemovePublisher stops following the publisher at endpoint, and forgets
// its sequence state and the recovery state of its worker. It is
// synchronous: once it returns, nothing that came from that endpoint
// reaches Config.Sink or Config.Load any more (events received but not yet
// applied, and recovery queries under way, are dropped), so the host may
// remove the worker (router.RemoveWorker) right after without a late event
// indexing its blocks again. It does not touch the index itself. While
// Run runs, it waits for Run's loop, which never blocks on the network;
// it must not be called from the Sink or the LoadReporter.
func (s *Subscriber) RemovePublisher(endpoint string) { s.pubs.remove(endpoint) }

// SetDPStartRanks sets the data_parallel_start_rank of the workers
// (by instance id) whose ranks do not start at 0, replacing the table
// set before; workers it does not name start at 0. Events and load
// reports of such a worker are applied to rank R-start, and those naming
// a rank below its start are counted in Stats.Malformed and skipped. Call
// it before adding the worker's publishers (package discovery/dynamo's
// PoolSink does). It returns an error wrapping ErrConfig, and changes
// nothing, for a negative start or one beyond a uint32. It may be called
// from any goroutine.
func (s *Subscriber) SetDPStartRanks(starts map[uint64]int) error { return s.starts.set(starts) }

// DPStartRank returns the start rank SetDPStartRanks gave worker, 0 if
// none.
func (s *Subscriber) DPStartRank(worker uint64) int { return int(s.starts.get(worker)) }

// Publishers returns the publishers the subscriber follows.
func (s *Subscriber) Publishers() []Publisher { return s.pubs.values() }

// samePublisher reports whether a and b describe the same publisher.
func samePublisher(a, b Publisher) bool {
	ra, rb := a.Recovery, b.Recovery
	a.Recovery, b.Recovery = nil, nil
	return a == b && (ra == rb || ra != nil && rb != nil && *ra == *rb)
}

// Stats returns the subscriber's counters.
func (s *Subscriber) Stats() Stats { return s.stats.snapshot() }

// inbound is one received message and the connection it came from.
type inbound struct {
	conn   *conn
	frames [][]byte
	// session numbers the connection the message came over: a
	// publisher whose sequence goes back on a new connection restarted
	// (see core.sequence).
	session uint64
}

// conn is one followed publisher endpoint while Run runs.
type conn struct {
	pub    Publisher
	cancel context.CancelFunc
	ids    map[uint64]struct{} // publisher ids seen on it (Run's goroutine)
}

// Run follows the publishers (as they are added and removed) until ctx
// ends, reconnecting each (with backoff up to MaxBackoff) when it cannot
// connect, fails or stays idle for IdleTimeout. It returns nil when ctx
// ends, or ErrRunning if Run is already running. The goroutines it starts
// have ended when it returns.
func (s *Subscriber) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer s.running.Store(false)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	s.pubs.start()
	defer s.pubs.stop()

	c := newCore(ctx, s.cfg.Sink, s.cfg.Load, &s.cfg.Query, s.cfg.RecoveryGiveUp, s.log, &s.stats, &s.starts)
	defer func() { cancel(); c.wg.Wait() }()
	msgs := make(chan inbound, queueLen)
	conns := make(map[string]*conn)
	reconcile := func() {
		want, waiting := s.pubs.snapshot()
		defer release(waiting)
		for ep, cn := range conns {
			if p, ok := want[ep]; !ok || !samePublisher(p, cn.pub) {
				cn.cancel()
				c.forget(cn.ids, sourceOf(&cn.pub))
				delete(conns, ep)
			}
		}
		for ep, p := range want {
			if conns[ep] != nil {
				continue
			}
			cctx, ccancel := context.WithCancel(ctx)
			cn := &conn{pub: p, cancel: ccancel, ids: make(map[uint64]struct{})}
			conns[ep] = cn
			c.added(sourceOf(&cn.pub))
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.follow(cctx, cn, msgs)
			}()
		}
	}
	reconcile()
	var m Message
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.pubs.wake:
			reconcile()
		case res := <-c.results:
			c.answered(&res)
		case in := <-msgs:
			if conns[in.conn.pub.Endpoint] != in.conn {
				continue // from a connection removed since
			}
			if err := DecodeZMQ(in.frames, &m); err != nil {
				s.stats.malformed.Add(1)
				s.log.Warn("dynamo: skipping malformed message", "endpoint", in.conn.pub.Endpoint, "err", err)
			} else {
				in.conn.ids[m.PublisherID] = struct{}{}
				c.handle(m.Topic, &m.Envelope, sourceOf(&in.conn.pub), in.session)
			}
			s.stats.received.Add(1) // last: see Stats.Received
		}
	}
}

// follow keeps a SUB connection to cn's endpoint until ctx ends.
func (s *Subscriber) follow(ctx context.Context, cn *conn, out chan<- inbound) {
	backoff := minBackoff
	log := s.log.With("endpoint", cn.pub.Endpoint)
	for ctx.Err() == nil {
		connected, err := s.session(ctx, cn, out)
		if err != nil && ctx.Err() == nil {
			log.Debug("dynamo: connection ended", "err", err)
		}
		if connected {
			backoff = minBackoff
			continue
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
}

// session runs one SUB connection until ctx ends, it fails or it stays
// idle. It reports whether it connected.
func (s *Subscriber) session(ctx context.Context, cn *conn, out chan<- inbound) (bool, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(sctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.DialTimeout))
	defer sub.Close()
	if err := zmqdial.Dial(sctx, sub, cn.pub.Endpoint, s.cfg.DialTimeout); err != nil {
		return false, err
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, cn.pub.Topic); err != nil {
		return false, err
	}
	s.stats.reconnects.Add(1)
	session := s.sessions.Add(1)
	recv := make(chan [][]byte, 64)
	done := make(chan error, 1)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				done <- err
				return
			}
			select {
			case recv <- m.Frames:
			case <-sctx.Done():
				done <- sctx.Err()
				return
			}
		}
	}()
	defer func() {
		cancel()
		sub.Close()
		<-done
	}()
	var idle <-chan time.Time
	var timer *time.Timer
	if s.cfg.IdleTimeout > 0 {
		timer = time.NewTimer(s.cfg.IdleTimeout)
		defer timer.Stop()
		idle = timer.C
	}
	for {
		select {
		case <-ctx.Done():
			return true, nil
		case err := <-done:
			done <- err // for the deferred wait
			return true, err
		case f := <-recv:
			select {
			case out <- inbound{conn: cn, frames: f, session: session}:
			case <-ctx.Done():
				return true, nil
			}
			if timer != nil {
				timer.Reset(s.cfg.IdleTimeout)
			}
		case <-idle:
			return true, nil
		}
	}
}
