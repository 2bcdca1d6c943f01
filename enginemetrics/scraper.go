package enginemetrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scheduling"
)

// Errors returned by the Scraper.
var (
	// ErrConfig is wrapped by New for an invalid Config.
	ErrConfig = errors.New("enginemetrics: invalid configuration")
	// ErrScrape is wrapped by errors fetching an engine's metrics.
	ErrScrape = errors.New("enginemetrics: cannot scrape")
	// ErrBlockSize is wrapped by *BlockSizeError.
	ErrBlockSize = errors.New("enginemetrics: block size mismatch")
)

// BlockSizeError reports an engine whose KV block size differs from the
// router's: its KV events and the router's hashes would never match.
type BlockSizeError struct {
	Worker kvroute.WorkerID
	Engine int // the engine's block size
	Router int // the router's
}

// Error implements error.
func (e *BlockSizeError) Error() string {
	return fmt.Sprintf("enginemetrics: worker %d has KV block size %d, the router hashes blocks of %d", e.Worker, e.Engine, e.Router)
}

// Is reports ErrBlockSize.
func (e *BlockSizeError) Is(target error) bool { return target == ErrBlockSize }

// Reporter receives load reports; *router.Router is one.
type Reporter interface {
	Heartbeat(w kvroute.WorkerKey, load scheduling.Load) error
	Hasher() kvroute.Hasher
}

// Defaults of Config.
const (
	DefaultInterval = time.Second
	DefaultTimeout  = 2 * time.Second
)

// Config configures a Scraper.
type Config struct {
	// Router receives the heartbeats and gives the block size to check.
	// Required.
	Router Reporter
	// Client fetches the metrics. Nil means http.DefaultClient (each
	// scrape is bounded by Timeout anyway).
	Client *http.Client
	// Interval is the time between scrapes of one engine. Zero means
	// DefaultInterval.
	Interval time.Duration
	// Timeout bounds one scrape. Zero means DefaultTimeout.
	Timeout time.Duration
	// Logger receives failed scrapes at warn level. Nil discards.
	Logger *slog.Logger
}

// Target is one engine to scrape.
type Target struct {
	// Worker is the engine's worker id in the router.
	Worker kvroute.WorkerID
	// URL is the engine's metrics URL, such as
	// "http://10.0.0.7:8000/metrics".
	URL string
	// Kind says whose metric names to read; KindAuto detects them.
	Kind Kind
	// Ranks is the number of data-parallel ranks to report; zero means
	// as many as the metrics show (at least 1).
	Ranks int
}

// Scraper scrapes engines' metrics and reports them as load. It is safe
// for concurrent use: run one Run per engine.
type Scraper struct {
	cfg Config
	log *slog.Logger
}

// New returns a Scraper for cfg.
func New(cfg Config) (*Scraper, error) {
	if cfg.Router == nil {
		return nil, fmt.Errorf("%w: Router is required", ErrConfig)
	}
	if cfg.Interval < 0 || cfg.Timeout < 0 {
		return nil, fmt.Errorf("%w: negative interval or timeout", ErrConfig)
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Client == nil {
		cfg.Client = http.DefaultClient
	}
	s := &Scraper{cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s, nil
}

// Scrape fetches and parses one target's metrics. Errors wrap ErrScrape
// or ErrMetrics.
func (s *Scraper) Scrape(ctx context.Context, t Target) (Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		return Metrics{}, fmt.Errorf("%w: worker %d: %w", ErrScrape, t.Worker, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return Metrics{}, fmt.Errorf("%w: worker %d: %w", ErrScrape, t.Worker, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return Metrics{}, fmt.Errorf("%w: worker %d: %s answered %s", ErrScrape, t.Worker, t.URL, resp.Status)
	}
	m, err := Parse(resp.Body, t.Kind)
	if err != nil {
		return Metrics{}, fmt.Errorf("worker %d: %w", t.Worker, err)
	}
	return m, nil
}

// Verify scrapes a target once, before it is registered, and checks that
// its KV block size (when it reports one) is the router's. It returns a
// *BlockSizeError (matching ErrBlockSize) on a mismatch, and the scrape's
// errors.
func (s *Scraper) Verify(ctx context.Context, t Target) (Metrics, error) {
	m, err := s.Scrape(ctx, t)
	if err != nil {
		return m, err
	}
	if bs := s.cfg.Router.Hasher().BlockSize(); m.BlockSize != 0 && m.BlockSize != bs {
		return m, &BlockSizeError{Worker: t.Worker, Engine: m.BlockSize, Router: bs}
	}
	return m, nil
}

// Report sends one scrape's loads to the router, one heartbeat per rank
// the scrape reported (up to Target.Ranks when set): a rank it says
// nothing of sends none, so that the router's heartbeat timeouts judge
// it. It returns the first heartbeat error (router.ErrUnknownWorker when
// the worker is not registered).
func (s *Scraper) Report(t Target, m *Metrics) error {
	ranks := len(m.Ranks)
	if t.Ranks > 0 {
		ranks = min(ranks, t.Ranks)
	}
	var first error
	for r := range ranks {
		if !m.Ranks[r].Reported {
			continue
		}
		if err := s.cfg.Router.Heartbeat(kvroute.WorkerKey{ID: t.Worker, Rank: kvroute.DPRank(r)}, m.Load(r)); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Run scrapes t every Interval and reports its load until ctx ends; it
// then returns ctx's error. Failed scrapes are logged and send no
// heartbeat. A scrape whose block size no longer matches the router's
// (the engine restarted with another configuration) is not reported
// either.
func (s *Scraper) Run(ctx context.Context, t Target) error {
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	for {
		m, err := s.Verify(ctx, t)
		if err == nil {
			err = s.Report(t, &m)
		}
		if err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "enginemetrics: no load report", "worker", t.Worker, "url", t.URL, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
