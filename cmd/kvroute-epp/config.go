package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/epp"
	"github.com/kvroute/kvroute/render"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// config is the JSON configuration file; flags override its fields.
type config struct {
	Listen        string `json:"listen"`
	MetricsListen string `json:"metrics_listen"`
	BlockSize     int    `json:"block_size"`
	// Model is the served model's name, used by the parity probe.
	Model string `json:"model"`
	// Adapters maps model names to LoRA adapters.
	Adapters map[string]string `json:"adapters"`
	// Tokenizer is the URL of the render/tokenize endpoints; empty means
	// the first static engine's.
	Tokenizer    string `json:"tokenizer"`
	TokenizerAPI string `json:"tokenizer_api"`
	// Parity is "fail" (default), "warn" or "off".
	Parity     string `json:"parity"`
	ParityWait string `json:"parity_wait"`
	Fallbacks  int    `json:"fallbacks"`
	// InjectUsage is -inject-usage; left out, the flag's value.
	InjectUsage    *bool  `json:"inject_usage"`
	ScrapeInterval string `json:"scrape_interval"`
	// BusyKV and BusyPrefillTokens mark engines too loaded to pick (the
	// picker answers 429 when all are): active decode blocks above this
	// fraction of the engine's KV cache (num_gpu_blocks from its metrics),
	// and active prefill tokens above this count. Zero disables each.
	BusyKV            float64 `json:"busy_kv"`
	BusyPrefillTokens int     `json:"busy_prefill_tokens"`
	// LoadReports is "capacities" (the default: the engines' metrics give
	// their capacities and the picker counts the requests it routed) or
	// "merged" (their running requests and KV usage count too, for
	// engines that also serve traffic the picker does not route).
	LoadReports router.LoadReportMode `json:"load_reports"`
	Engines     []discovery.Engine    `json:"engines"`
	Etcd        struct {
		Endpoints []string `json:"endpoints"`
		Prefix    string   `json:"prefix"`
	} `json:"etcd"`
	Kube kubeConfig `json:"kubernetes"`

	logLevel       slog.Level
	scrapeInterval time.Duration
	parityWait     time.Duration
	tokenizerAPI   render.API
}

// kubeConfig selects the pods of a pool in the picker's cluster.
type kubeConfig struct {
	Namespace  string `json:"namespace"`
	Pool       string `json:"inference_pool"`
	Selector   string `json:"selector"`
	Ports      []int  `json:"target_ports"`
	EventsPort int    `json:"events_port"`
	ReplayPort int    `json:"replay_port"`
}

func (k *kubeConfig) enabled() bool { return k.Pool != "" || k.Selector != "" }

// intList is a comma-separated list of ints.
type intList []int

func (l *intList) String() string { return fmt.Sprint([]int(*l)) }

func (l *intList) Set(s string) error {
	*l = (*l)[:0]
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return err
		}
		*l = append(*l, n)
	}
	return nil
}

// engineFlags collects repeated -engine flags.
type engineFlags []discovery.Engine

func (e *engineFlags) String() string { return fmt.Sprint(len(*e), " engines") }

func (e *engineFlags) Set(s string) error {
	eng, err := discovery.ParseEngine(s)
	if err != nil {
		return err
	}
	*e = append(*e, eng)
	return nil
}

// adapterFlags collects repeated -adapter MODEL=ADAPTER flags.
type adapterFlags map[string]string

func (a adapterFlags) String() string { return fmt.Sprint(len(a), " adapters") }

func (a adapterFlags) Set(s string) error {
	m, l, ok := strings.Cut(s, "=")
	if !ok || m == "" || l == "" {
		return fmt.Errorf("adapter %q is not MODEL=ADAPTER", s)
	}
	a[m] = l
	return nil
}

// parse reads the flags and the configuration file they name.
func parse(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("kvroute-epp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		engines  engineFlags
		adapters = adapterFlags{}
		path     = fs.String("config", "", "JSON configuration file (see the README)")
		listen   = fs.String("listen", ":9002", "address of the ext_proc and gRPC health server")
		mlisten  = fs.String("metrics-listen", ":9090", "address of the Prometheus /metrics and /healthz server")
		block    = fs.Int("block-size", kvroute.DefaultBlockSize, "the engines' KV block size in tokens")
		model    = fs.String("model", "", "served model name (for the token parity probe)")
		tokURL   = fs.String("tokenizer", "", "base URL of the render/tokenize endpoints (default: the first -engine)")
		tokAPI   = fs.String("tokenizer-api", "vllm-render", "vllm-render, vllm-tokenize or sglang")
		parity   = fs.String("parity", "fail", "token parity probe at startup: fail, warn or off")
		pwait    = fs.Duration("parity-wait", 10*time.Second, "how long to wait for discovery before the parity probe")
		fallback = fs.Int("fallbacks", epp.DefaultFallbacks, "fallback endpoints listed after the pick (-1: none)")
		inject   = fs.Bool("inject-usage", true, "ask streamed requests for usage to learn the engines' cached tokens")
		scrape   = fs.Duration("scrape-interval", time.Second, "engine metrics scrape interval")
		busyKV   = fs.Float64("busy-kv", 0, "an engine whose active decode blocks exceed this fraction of its KV cache is busy (0: off)")
		busyPF   = fs.Int("busy-prefill-tokens", 0, "an engine with more active prefill tokens is busy (0: off)")
		etcdEPs  = fs.String("etcd", "", "comma-separated etcd endpoints to discover engines from")
		etcdPfx  = fs.String("etcd-prefix", "/kvroute/engines/", "etcd key prefix of the engines")
		kns      = fs.String("kube-namespace", "default", "namespace of the engines' pods and the InferencePool")
		kpool    = fs.String("kube-pool", "", "InferencePool whose selector and target ports give the engines (in-cluster)")
		ksel     = fs.String("kube-selector", "", "label selector of the engines' pods, instead of -kube-pool")
		kevents  = fs.Int("kube-events-port", 0, "KV-event port of pods without the kvroute.io/kv-events annotation")
		kreplay  = fs.Int("kube-replay-port", 0, "KV-event replay port of pods without the kvroute.io/kv-replay annotation")
		kports   intList
		c        config
	)
	fs.Var(&kports, "kube-ports", "comma-separated target ports, one per data-parallel rank, with -kube-selector")
	fs.Var(&engines, "engine", "static engine NAME=HOST:PORT[,events=tcp://...][,replay=...][,metrics=URL][,kind=vllm|sglang][,ports=P+P] (repeatable)")
	fs.Var(adapters, "adapter", "model name served by a LoRA adapter, MODEL=ADAPTER (repeatable)")
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn, error")
	var loadReports router.LoadReportMode
	fs.TextVar(&loadReports, "load-reports", router.LoadReportCapacities,
		"what routing takes from engines' metrics: capacities (the picker counts the requests it routed) or merged (engines' running requests count too: for engines that also serve other traffic)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *path != "" {
		raw, err := os.ReadFile(*path)
		if err != nil {
			return nil, err
		}
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return nil, fmt.Errorf("%s: %w", *path, err)
		}
		for i := range c.Engines {
			if !c.Engines[i].Ready {
				c.Engines[i].Ready = true // static engines are ready
			}
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	str := func(name string, dst *string, v string) {
		if set[name] || *dst == "" {
			*dst = v
		}
	}
	str("listen", &c.Listen, *listen)
	str("metrics-listen", &c.MetricsListen, *mlisten)
	str("model", &c.Model, *model)
	str("tokenizer", &c.Tokenizer, *tokURL)
	str("tokenizer-api", &c.TokenizerAPI, *tokAPI)
	str("parity", &c.Parity, *parity)
	str("etcd-prefix", &c.Etcd.Prefix, *etcdPfx)
	if set["block-size"] || c.BlockSize == 0 {
		c.BlockSize = *block
	}
	if set["fallbacks"] || c.Fallbacks == 0 {
		c.Fallbacks = *fallback
	}
	if set["busy-kv"] {
		c.BusyKV = *busyKV
	}
	if set["busy-prefill-tokens"] {
		c.BusyPrefillTokens = *busyPF
	}
	if set["load-reports"] {
		c.LoadReports = loadReports
	}
	if err := c.busy().Validate(); err != nil {
		return nil, err
	}
	if set["inject-usage"] || c.InjectUsage == nil {
		c.InjectUsage = inject
	}
	str("kube-namespace", &c.Kube.Namespace, *kns)
	if set["kube-pool"] {
		c.Kube.Pool = *kpool
	}
	if set["kube-selector"] {
		c.Kube.Selector = *ksel
	}
	if set["kube-ports"] {
		c.Kube.Ports = kports
	}
	if set["kube-events-port"] {
		c.Kube.EventsPort = *kevents
	}
	if set["kube-replay-port"] {
		c.Kube.ReplayPort = *kreplay
	}
	if c.Kube.Selector != "" && c.Kube.Pool == "" && len(c.Kube.Ports) == 0 {
		return nil, errors.New("-kube-selector needs -kube-ports")
	}
	if c.Kube.Pool != "" && (c.Kube.Selector != "" || len(c.Kube.Ports) > 0) {
		return nil, errors.New("-kube-pool reads the selector and ports from the InferencePool: give -kube-selector and -kube-ports only instead of it")
	}
	if set["etcd"] {
		c.Etcd.Endpoints = strings.Split(*etcdEPs, ",")
	}
	if c.Adapters == nil {
		c.Adapters = map[string]string{}
	}
	for m, l := range adapters {
		c.Adapters[m] = l
	}
	c.Engines = append(c.Engines, engines...)
	names := map[string]bool{}
	for i := range c.Engines {
		e := &c.Engines[i]
		if err := e.Validate(); err != nil {
			return nil, err
		}
		if names[e.Name] {
			return nil, fmt.Errorf("engine %q given twice", e.Name)
		}
		names[e.Name] = true
	}
	var err error
	if c.scrapeInterval, err = duration(set["scrape-interval"], c.ScrapeInterval, *scrape); err != nil {
		return nil, err
	}
	if c.parityWait, err = duration(set["parity-wait"], c.ParityWait, *pwait); err != nil {
		return nil, err
	}
	if c.tokenizerAPI, err = render.ParseAPI(c.TokenizerAPI); err != nil {
		return nil, err
	}
	switch c.Parity {
	case "fail", "warn", "off":
	default:
		return nil, fmt.Errorf("-parity %q: want fail, warn or off", c.Parity)
	}
	if len(c.Engines) == 0 && c.Etcd.Endpoints == nil && !c.Kube.enabled() {
		return nil, errors.New("no engines: give -engine, -etcd, -kube-pool, -kube-selector or -config")
	}
	if c.Tokenizer == "" {
		i := slices.IndexFunc(c.Engines, func(e discovery.Engine) bool { return len(e.Ports) > 0 })
		if i < 0 {
			return nil, errors.New("no tokenizer: give -tokenizer (an engine or a render server) when no static engine has a port")
		}
		c.Tokenizer = "http://" + c.Engines[i].Address(0)
	}
	return &c, nil
}

// duration picks the flag's value when it was given, else the file's.
func duration(flagSet bool, file string, flagValue time.Duration) (time.Duration, error) {
	if flagSet || file == "" {
		return flagValue, nil
	}
	d, err := time.ParseDuration(file)
	if err != nil {
		return 0, fmt.Errorf("duration %q: %w", file, err)
	}
	return d, nil
}

// tokenizer is the picker's tokenizer.
func (c *config) tokenizer() (epp.Tokenizer, error) {
	return &render.Client{URL: c.Tokenizer, API: c.tokenizerAPI}, nil
}

// busy is the router's busy thresholds.
func (c *config) busy() scheduling.BusyThresholds {
	return scheduling.BusyThresholds{DecodeBlocks: c.BusyKV, MaxPrefillTokens: c.BusyPrefillTokens}
}
