// Command kvroute-epp is an Endpoint Picker for the Gateway API Inference
// Extension: an Envoy ext_proc server that routes each request to the
// engine of an InferencePool holding the longest cached prefix of its
// prompt, from the engines' KV events, with their Prometheus metrics as
// load.
//
// Usage:
//
//	kvroute-epp -listen :9002 -metrics-listen :9090 -block-size 16 -model meta-llama/Llama-3.1-8B-Instruct \
//	    -engine 'vllm-0=10.0.0.7:8000,events=tcp://10.0.0.7:5557,replay=tcp://10.0.0.7:5558,metrics=http://10.0.0.7:8000/metrics' \
//	    -engine 'vllm-1=10.0.0.8:8000,events=tcp://10.0.0.8:5557,replay=tcp://10.0.0.8:5558,metrics=http://10.0.0.8:8000/metrics'
//
// or engines from etcd (-etcd http://etcd:2379 -etcd-prefix /kvroute/pool-a/),
// from the pods of an InferencePool (-kube-pool llama, in-cluster), or
// from a JSON file given with -config (see the README). Flags given explicitly
// override the file. Start vLLM with --kv-events-config '{"enable_kv_cache_events":
// true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint":
// "tcp://*:5558"}' and --enable-prompt-tokens-details.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/etcd"
	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/epp"
	"github.com/kvroute/kvroute/kvevents/zmq"
	"github.com/kvroute/kvroute/render"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/router/routerprom"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "kvroute-epp:", err)
		os.Exit(1)
	}
}

// addrs are the picker's listening addresses, for tests.
type addrs struct {
	GRPC, Metrics net.Addr
}

// run serves the picker until ctx ends. ready, when not nil, receives the
// listening addresses once the picker serves.
func run(ctx context.Context, args []string, stderr io.Writer, ready chan<- addrs) error {
	cfg, err := parse(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	hasher, err := kvroute.NewHasher(kvroute.HasherConfig{BlockSize: cfg.BlockSize})
	if err != nil {
		return err
	}
	r, err := router.New(router.Config{Hasher: hasher, Busy: cfg.busy(), LoadReports: cfg.LoadReports, Logger: log})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = r.RunHealthChecks(ctx, time.Second) }()

	eps := &epp.Endpoints{}
	scraper, err := enginemetrics.New(enginemetrics.Config{Router: r, Interval: cfg.scrapeInterval, Logger: log})
	if err != nil {
		return err
	}
	tok, err := cfg.tokenizer()
	if err != nil {
		return err
	}
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, Addresses: eps, Scraper: scraper,
		Subscriber: zmq.Config{Logger: log}, Admit: parityCheck(cfg, tok, log), Logger: log})
	if err != nil {
		return err
	}
	defer pool.Close()
	picker, err := epp.New(epp.Config{Router: r, Endpoints: eps, Tokenizer: tok, Adapters: cfg.Adapters,
		Fallbacks: cfg.Fallbacks, InjectUsage: *cfg.InjectUsage, Logger: log})
	if err != nil {
		return err
	}

	// Discovery: the static engines and each watcher's are parts of one
	// set, so that a watcher's Sync never removes the static engines.
	sources := make(chan error, 2)
	merged := discovery.NewMerged(pool, 3)
	if len(cfg.Engines) > 0 {
		merged.Source(0).Sync(ctx, cfg.Engines)
	}
	if cfg.Etcd.Endpoints != nil {
		c, err := clientv3.New(clientv3.Config{Endpoints: cfg.Etcd.Endpoints, DialTimeout: 5 * time.Second, Context: ctx})
		if err != nil {
			return fmt.Errorf("etcd: %w", err)
		}
		defer c.Close()
		w := &etcd.Watcher{Client: c, Prefix: cfg.Etcd.Prefix, Logger: log}
		go func() { sources <- w.Run(ctx, merged.Source(1)) }()
	}

	if cfg.Kube.enabled() {
		if err := startKube(ctx, cfg, merged.Source(2), log, sources); err != nil {
			return err
		}
	}

	// Token parity: the picker's tokenizer against each engine's own.
	if err := probeParity(ctx, cfg, pool); err != nil {
		return err
	}

	// Servers.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	g := grpc.NewServer()
	picker.Register(g)
	served := make(chan error, 2)
	go func() { served <- g.Serve(ln) }()
	defer g.Stop()

	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(picker), routerprom.New(r, "kvroute"))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(http.ResponseWriter, *http.Request) {})
	mln, err := net.Listen("tcp", cfg.MetricsListen)
	if err != nil {
		return err
	}
	msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { served <- msrv.Serve(mln) }()
	defer msrv.Close()
	log.Info("kvroute-epp serving", "grpc", ln.Addr().String(), "metrics", mln.Addr().String(),
		"block_size", cfg.BlockSize, "engines", len(pool.Members()))
	if ready != nil {
		ready <- addrs{GRPC: ln.Addr(), Metrics: mln.Addr()}
	}

	// Readiness follows whether any endpoint is known.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	picker.SetReady(eps.Len() > 0)
	for {
		select {
		case <-ctx.Done():
			log.Info("shutting down")
			picker.SetReady(false)
			stopped := make(chan struct{})
			go func() { g.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(30 * time.Second):
			}
			return nil
		case err := <-served:
			return err
		case err := <-sources:
			if ctx.Err() == nil {
				return fmt.Errorf("discovery stopped: %w", err)
			}
		case <-tick.C:
			picker.SetReady(eps.Len() > 0)
		}
	}
}

// parityCheck returns the Pool's admission check: the picker's tokenizer
// and the engine's own render endpoint tokenize a chat with tools; with
// -parity fail an engine that disagrees is left out (and tried again
// later), with -parity warn it is admitted and the mismatch logged as an
// error.
func parityCheck(cfg *config, tok epp.Tokenizer, log *slog.Logger) func(context.Context, *discovery.Engine) error {
	if cfg.Parity == "off" {
		return nil
	}
	return func(ctx context.Context, e *discovery.Engine) error {
		var err error
		if len(e.Ports) == 0 {
			err = errors.New("the engine has no port to probe")
		} else {
			engine := &render.Client{URL: "http://" + e.Address(0), API: cfg.tokenizerAPI}
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			err = render.Probe(pctx, tok, engine, cfg.Model)
		}
		switch {
		case err == nil:
			log.Info("token parity probe passed", "engine", e.Name)
			return nil
		case cfg.Parity == "warn":
			log.Error("TOKEN PARITY PROBE FAILED: the picker's token ids differ from the engine's; prefix routing will find no cache hits on it",
				"engine", e.Name, "err", err)
			return nil
		default:
			return fmt.Errorf("token parity probe failed (use -parity warn to route to it anyway): %w", err)
		}
	}
}

// probeParity waits for discovery to find the first engines and refuses to
// start, with -parity fail, when any was left out by the parity check.
func probeParity(ctx context.Context, cfg *config, pool *discovery.Pool) error {
	if cfg.Parity != "fail" {
		return nil
	}
	deadline := time.Now().Add(cfg.parityWait)
	for len(pool.Members()) == 0 && len(pool.Rejected()) == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
	var errs []error
	for name, err := range pool.Rejected() {
		if errors.Is(err, render.ErrMismatch) {
			errs = append(errs, fmt.Errorf("engine %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
