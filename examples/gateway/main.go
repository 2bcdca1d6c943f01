// Command gateway is an HTTP gateway for OpenAI-compatible inference
// engines (vLLM, SGLang) that routes every request to the engine holding
// the longest cached prefix of its prompt, from the engines' ZMQ KV events.
//
// Usage:
//
//	gateway -listen :8080 \
//	    -engine '1=http://10.0.0.7:8000,events=tcp://10.0.0.7:5557,replay=tcp://10.0.0.7:5558' \
//	    -engine '2=http://10.0.0.8:8000,events=tcp://10.0.0.8:5557,replay=tcp://10.0.0.8:5558' \
//	    -tokenize-url http://10.0.0.7:8000
//
// or with -config engines.json:
//
//	{"listen": ":8080", "block_size": 16, "tokenize_url": "http://10.0.0.7:8000",
//	 "engines": [{"id": 1, "url": "http://10.0.0.7:8000", "events": "tcp://10.0.0.7:5557"}]}
//
// The file is checked as it is read: a field the gateway does not know, a
// value of the wrong type or range, an invalid engine or two engines with
// one id is an error naming the setting, such as "engines[1]: ...".
//
// Engines may share one URL and be told apart by headers: for workers
// behind NVIDIA Dynamo's frontend started with --router-mode direct, give
// each worker's instance id and the frontend's URL with preset=dynamo:
//
//	gateway -engine '6102808441099218236=http://127.0.0.1:8000,preset=dynamo' \
//	    -engine '15810847705965030232=http://127.0.0.1:8000,preset=dynamo' ...
//
// (header=NAME:VALUE sets any other header; "{id}" and "{rank}" in a value
// are the worker id and data-parallel rank).
//
// # Dynamo mode
//
// In front of an NVIDIA Dynamo deployment (workers and a frontend started
// with --router-mode direct), the gateway discovers the workers from
// Dynamo's store, follows their KV events and load reports on Dynamo's
// event plane, tokenizes prompts with the model directory's tokenizer and
// sends each request to the frontend naming the chosen worker (no probe
// request, no extra port):
//
//	gateway -listen 127.0.0.1:8080 -block-size 16 -model-dir /models/tiny \
//	    -dynamo-store file:$DYN_FILE_KV -dynamo-frontend http://127.0.0.1:8000 -dynamo-model tiny
//
// -dynamo-store also takes etcd:http://127.0.0.1:2379[,...]. The config
// file's "dynamo" object holds the same: {"store", "frontend", "model",
// "namespace", "component", "endpoint", "callback_host": the address
// workers connect back to when the gateway recovers events from their
// local indexer, default $DYN_TCP_RESPONSE_STREAM_HOST or 127.0.0.1}, and
// "model_dir" the model directory. -block-size must be the workers' (their model card's
// kv_cache_block_size): workers with another are left out, with a log
// record.
//
// # Metrics
//
// GET /metrics on the listen address serves Prometheus metrics: the
// router's (kvroute_router_*, among them predicted and engine-reported
// cached tokens and the routing accuracy), the gateway's
// (kvroute_gateway_*) and the KV-event ingestion counters of package
// kvevents/kvprom (kvroute_kvevents_*, labelled engine="ID/RANK" per
// subscriber: batches received, replayed, lost and malformed, gaps,
// resets, unknown parents, skipped groups, block-size rejects, events
// applied per kind; kvroute_dynamo_events_* for Dynamo's event plane).
//
// Flags given explicitly override the file; engines from both are used.
// Start vLLM with --kv-events-config '{"enable_kv_cache_events": true,
// "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint":
// "tcp://*:5558"}' and --enable-prompt-tokens-details so that the router
// learns what each engine caches and how well it predicted it.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/kvevents/kvprom"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/router/routerprom"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// fileConfig is the JSON configuration file.
type fileConfig struct {
	Listen         string           `json:"listen"`
	BlockSize      int              `json:"block_size"`
	TokenizeURL    string           `json:"tokenize_url"`
	HealthInterval string           `json:"health_interval"`
	RemoveAfter    string           `json:"remove_after"`
	MaxAttempts    int              `json:"max_attempts"`
	Engines        []gateway.Engine `json:"engines"`
	// TokenizeRender uses vLLM's render endpoints at tokenize_url.
	TokenizeRender bool `json:"tokenize_render"`
	// Adapters maps model names to LoRA adapters.
	Adapters map[string]string `json:"adapters"`
	// ModelDir is a model directory whose tokenizer tokenizes prompts.
	ModelDir string `json:"model_dir"`
	// Dynamo configures the Dynamo mode.
	Dynamo dynamoConfig `json:"dynamo"`
	// LoadReports is what routing takes from the engines' load reports:
	// "capacities" (the default: the gateway counts the requests it
	// routed) or "merged" (the engines' running requests count too, for
	// engines that also serve traffic the gateway does not route); see
	// router.Config.LoadReports.
	LoadReports string `json:"load_reports,omitempty"`
}

// engineFlags collects repeated -engine flags.
type engineFlags []gateway.Engine

func (e *engineFlags) String() string { return fmt.Sprint(len(*e), " engines") }

func (e *engineFlags) Set(s string) error {
	eng, err := gateway.ParseEngine(s)
	if err != nil {
		return err
	}
	*e = append(*e, eng)
	return nil
}

// options are the parsed command line and configuration file.
type options struct {
	file     fileConfig
	interval time.Duration
	remove   time.Duration
	logLevel slog.Level
	// loadReports is file.LoadReports, checked.
	loadReports router.LoadReportMode
}

// parse reads the flags and the configuration file they name.
func parse(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		o        options
		engines  engineFlags
		cfgPath  = fs.String("config", "", "JSON configuration file (engines, listen, block_size, tokenize_url, ...)")
		listen   = fs.String("listen", "127.0.0.1:8080", "address to serve the OpenAI API on")
		block    = fs.Int("block-size", kvroute.DefaultBlockSize, "the engines' KV block size in tokens")
		tokURL   = fs.String("tokenize-url", "", "engine whose /tokenize tokenizes prompts (empty: the word tokenizer, for tests)")
		attempt  = fs.Int("max-attempts", 3, "engines a request is tried on before it fails")
		rend     = fs.Bool("tokenize-render", false, "tokenize through vLLM's /v1/*/render endpoints instead of /tokenize")
		adapter  = fs.String("adapters", "", "comma-separated MODEL=ADAPTER pairs: models served by LoRA adapters")
		model    = fs.String("model-dir", "", "model directory (tokenizer.json, tokenizer_config.json) whose tokenizer tokenizes prompts in process")
		dynStore = fs.String("dynamo-store", "", "Dynamo mode: the deployment's discovery store, file:DIR (DYN_FILE_KV) or etcd:URL[,URL...]")
		dynFront = fs.String("dynamo-frontend", "", "Dynamo mode: URL of Dynamo's frontend started with --router-mode direct")
		dynModel = fs.String("dynamo-model", "", "Dynamo mode: serve the workers of this model only (empty: every model)")
		dynNS    = fs.String("dynamo-namespace", "", "Dynamo mode: serve the workers of this namespace only (empty: every namespace)")
		dynCB    = fs.String("dynamo-callback-host", "", "Dynamo mode: address workers connect back to when events are recovered from them (empty: $DYN_TCP_RESPONSE_STREAM_HOST or 127.0.0.1)")
		loadRep  = fs.String("load-reports", "", "what routing takes from engines' load reports: capacities (the default: the gateway counts the requests it routed) or merged (engines' running requests count too: for engines that also serve other traffic)")
	)
	fs.Var(&engines, "engine", "engine as ID=URL[,events=tcp://host:port][,replay=...][,topic=...][,ranks=N][,preset=dynamo][,header=NAME:VALUE] (repeatable)")
	fs.DurationVar(&o.interval, "health-interval", 2*time.Second, "how often engines' /health is probed (an engine is degraded after 2.5 intervals without a successful probe, at least 5s, and unhealthy after 5 intervals, at least 15s)")
	fs.DurationVar(&o.remove, "remove-after", 0, "remove an engine unhealthy this long (0: never)")
	fs.TextVar(&o.logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *cfgPath != "" {
		raw, err := os.ReadFile(*cfgPath)
		if err != nil {
			return nil, err
		}
		fc, err := decodeConfig(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", *cfgPath, err)
		}
		o.file, o.loadReports = fc.file, fc.loadReports
		if fc.interval != 0 && !set["health-interval"] {
			o.interval = fc.interval
		}
		if fc.remove != 0 && !set["remove-after"] {
			o.remove = fc.remove
		}
	}
	override := func(name string, apply func()) {
		if set[name] {
			apply()
		}
	}
	o.file.Listen = cmp.Or(o.file.Listen, *listen)
	o.file.BlockSize = cmp.Or(o.file.BlockSize, *block)
	o.file.MaxAttempts = cmp.Or(o.file.MaxAttempts, *attempt)
	override("listen", func() { o.file.Listen = *listen })
	override("block-size", func() { o.file.BlockSize = *block })
	override("tokenize-url", func() { o.file.TokenizeURL = *tokURL })
	override("max-attempts", func() { o.file.MaxAttempts = *attempt })
	override("tokenize-render", func() { o.file.TokenizeRender = *rend })
	override("model-dir", func() { o.file.ModelDir = *model })
	override("dynamo-store", func() { o.file.Dynamo.Store = *dynStore })
	override("dynamo-frontend", func() { o.file.Dynamo.Frontend = *dynFront })
	override("dynamo-model", func() { o.file.Dynamo.Model = *dynModel })
	override("dynamo-namespace", func() { o.file.Dynamo.Namespace = *dynNS })
	override("dynamo-callback-host", func() { o.file.Dynamo.CallbackHost = *dynCB })
	if set["load-reports"] {
		if err := o.loadReports.UnmarshalText([]byte(*loadRep)); err != nil {
			return nil, fmt.Errorf("-load-reports: %w", err)
		}
		o.file.LoadReports = *loadRep
	}
	if *adapter != "" {
		if o.file.Adapters == nil {
			o.file.Adapters = map[string]string{}
		}
		for _, pair := range strings.Split(*adapter, ",") {
			m, a, ok := strings.Cut(pair, "=")
			if !ok || m == "" || a == "" {
				return nil, fmt.Errorf("-adapters: %q is not MODEL=ADAPTER", pair)
			}
			o.file.Adapters[m] = a
		}
	}
	o.file.Engines = append(o.file.Engines, engines...)
	switch {
	case o.interval <= 0:
		return nil, fmt.Errorf("-health-interval %v is not a positive duration", o.interval)
	case o.remove < 0:
		return nil, fmt.Errorf("-remove-after %v is negative (0: never)", o.remove)
	case o.file.ModelDir != "" && o.file.TokenizeURL != "":
		return nil, errors.New("give a model directory or a tokenize URL, not both")
	case o.file.TokenizeRender && o.file.TokenizeURL == "":
		return nil, errors.New("-tokenize-render needs a tokenize URL")
	}
	if o.file.Dynamo.Store != "" {
		if err := o.file.Dynamo.validate(); err != nil {
			return nil, err
		}
		if o.file.ModelDir == "" {
			return nil, errors.New("-dynamo-store needs -model-dir: Dynamo's frontend has no tokenize endpoint")
		}
	} else if len(o.file.Engines) == 0 {
		return nil, errors.New("no engines: give -engine, -dynamo-store or -config")
	}
	return &o, nil
}

// healthConfig returns the router's health timeouts for engines probed
// every interval: the router's defaults (degraded 5 s, unhealthy 15 s
// after the last heartbeat) for the default interval of 2 s and shorter
// ones, and longer timeouts for a longer interval, so that an engine
// answering every probe is never judged late between two probes. A
// probe may take up to the interval to answer, so two intervals can pass
// between successful probes: an engine is degraded after two and a half
// intervals without one, unhealthy after five. (UnhealthyAfter is also
// how long an engine unhealthy from errors waits for its next chance.)
func healthConfig(interval time.Duration) router.HealthConfig {
	const degraded, unhealthy = 5 * time.Second, 15 * time.Second
	d := max(degraded, interval*5/2)
	return router.HealthConfig{DegradedAfter: d, UnhealthyAfter: max(unhealthy, 2*d)}
}

// run serves the gateway until ctx ends. ready, when not nil, receives the
// listening address.
func run(ctx context.Context, args []string, stderr io.Writer, ready chan<- net.Addr) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: o.logLevel}))
	hasher, err := kvroute.NewHasher(kvroute.HasherConfig{BlockSize: o.file.BlockSize})
	if err != nil {
		return err
	}
	r, err := router.New(router.Config{Hasher: hasher, LoadReports: o.loadReports, Logger: log, Health: healthConfig(o.interval)})
	if err != nil {
		return err
	}
	var tok gateway.Tokenizer = gateway.WordTokenizer{}
	switch {
	case o.file.ModelDir != "":
		if tok, err = gateway.LoadModelTokenizer(o.file.ModelDir); err != nil {
			return err
		}
	case o.file.TokenizeURL != "":
		tok = &gateway.RemoteTokenizer{URL: o.file.TokenizeURL, Render: o.file.TokenizeRender}
	default:
		log.Warn("no -model-dir or -tokenize-url: using the word tokenizer, whose token ids match no real model")
	}
	ingest := kvprom.New("kvroute")
	gcfg := gateway.Config{
		Router: r, Engines: o.file.Engines, Tokenizer: tok, MaxAttempts: o.file.MaxAttempts, Adapters: o.file.Adapters,
		HealthInterval: o.interval, RemoveAfter: o.remove, Logger: log, Subscribers: ingest,
	}
	var starts dpStarts
	if o.file.Dynamo.Store != "" {
		gcfg.Frontend = o.file.Dynamo.frontend()
		gcfg.FrontendDPStart = starts.get
	}
	gw, err := gateway.New(gcfg)
	if err != nil {
		return err
	}
	var dyn *dynamoMode
	if o.file.Dynamo.Store != "" {
		if dyn, err = newDynamoMode(o.file.Dynamo, r, gw, log); err != nil {
			return err
		}
		// Until Run takes over: a failure to start below leaves no pool
		// or store client behind.
		defer dyn.Close()
		starts.sub.Store(dyn.sub)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(routerprom.New(r, "kvroute"), newCollector(gw), ingest)
	if dyn != nil {
		dc := kvprom.NewDynamo("kvroute")
		dc.Add("dynamo", dyn.sub)
		reg.MustRegister(dc)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", gw)
	ln, err := net.Listen("tcp", o.file.Listen)
	if err != nil {
		return err
	}
	log.Info("gateway listening", "addr", ln.Addr().String(), "engines", len(o.file.Engines), "block_size", o.file.BlockSize,
		"dynamo_store", o.file.Dynamo.Store, "dynamo_frontend", o.file.Dynamo.Frontend)
	if ready != nil {
		ready <- ln.Addr()
	}

	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	ran := make(chan error, 1)
	go func() { ran <- gw.Run(runCtx) }()
	var dynRan chan error // nil without the Dynamo mode: never ready
	if dyn != nil {
		dynRan = make(chan error, 1)
		go func() { dynRan <- dyn.Run(runCtx) }()
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	// Serve until ctx ends, or until the gateway's or the Dynamo mode's
	// loop stops on its own, which leaves the gateway blind: then shut
	// down with its error.
	shutdown := func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	}
	var rerr, derr error
	gwDone, dynDone := false, dyn == nil
	select {
	case err = <-served:
	case <-ctx.Done():
		log.Info("shutting down")
		err = shutdown()
	case rerr = <-ran:
		gwDone = true
		err = fmt.Errorf("gateway loop stopped: %w", cmp.Or(rerr, errors.New("no error")))
		log.Error("shutting down", "err", err)
		_ = shutdown()
	case derr = <-dynRan:
		dynDone = true
		err = fmt.Errorf("dynamo discovery stopped: %w", cmp.Or(derr, errors.New("no error")))
		log.Error("shutting down", "err", err)
		_ = shutdown()
	}
	stopRun()
	if !gwDone {
		rerr = <-ran
	}
	if !dynDone {
		derr = <-dynRan
	}
	if err == nil || errors.Is(err, http.ErrServerClosed) {
		err = errors.Join(rerr, derr)
	}
	return err
}
