package epp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/render"
	"github.com/kvroute/kvroute/router"
)

// Protocol names of GIE's Endpoint Picker Protocol, the defaults of
// Config.
const (
	// HeaderDestination is the request header (and dynamic metadata key)
	// that names the picked endpoints, "ip:port" separated by commas in
	// the order Envoy should try them.
	HeaderDestination = "x-gateway-destination-endpoint"
	// KeySubset is the filter metadata key of the subset hint: the list
	// of endpoints the picker must choose from.
	KeySubset = "x-gateway-destination-endpoint-subset"
	// KeyServed is the filter metadata key under which the data plane
	// reports the endpoint that actually served the request.
	KeyServed = "x-gateway-destination-endpoint-served"
	// NamespaceLB is the metadata namespace of the picked and the served
	// endpoint.
	NamespaceLB = "envoy.lb"
	// NamespaceSubset is the metadata namespace of the subset hint.
	NamespaceSubset = "envoy.lb.subset_hint"
	// AttributesExtProc is the key of the attributes Envoy's ext_proc
	// filter sends (ProcessingRequest.attributes), and AttributeUpstream
	// the attribute naming the upstream "ip:port" that answered. Envoy
	// sends it with the response headers when the filter lists it in
	// response_attributes; the picker reads the served endpoint from it
	// when the data plane does not report KeyServed.
	AttributesExtProc = "envoy.filters.http.ext_proc"
	AttributeUpstream = "upstream.address"
)

// Health service names the Server reports through the gRPC health
// protocol, besides the ext_proc service's own name and "".
const (
	ServiceLiveness  = "liveness"
	ServiceReadiness = "readiness"
)

// Defaults of Config.
const (
	DefaultFallbacks    = 2
	DefaultMaxBodyBytes = 16 << 20
)

// ErrConfig is wrapped by New for an invalid Config.
var ErrConfig = errors.New("epp: invalid configuration")

// Tokenizer turns a parsed request into the token ids the engines will
// cache. Routing is only as good as this agreement: see package render
// for one that asks the engines themselves.
//
// Tokenize appends the ids to dst and returns the extended slice. It is
// called concurrently, once per routed request.
type Tokenizer interface {
	Tokenize(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, error)
}

// MMTokenizer is an optional interface of a Tokenizer that also reports
// the prompt's multimodal items (images and the placeholder tokens they
// occupy), which the engines hash into their blocks. The picker uses it
// when the Tokenizer has it.
type MMTokenizer = render.MMTokenizer

// TokenizerFunc adapts a function to Tokenizer.
type TokenizerFunc func(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, error)

// Tokenize calls f.
func (f TokenizerFunc) Tokenize(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, error) {
	return f(ctx, req, dst)
}

// Config configures a Server.
type Config struct {
	// Router picks the workers. Required.
	Router *router.Router
	// Endpoints maps the router's cache domains to their addresses.
	// Required; discovery or the host fills it.
	Endpoints *Endpoints
	// Tokenizer tokenizes completion and chat prompts. Required.
	Tokenizer Tokenizer
	// Adapters maps a request's model name to the LoRA adapter that
	// serves it: the picker rewrites the body's "model" to the adapter's
	// name and routes with its blocks (router.Request.LoRA), since engines
	// cache an adapter's blocks apart from the base model's. A request
	// naming an adapter (a value of the map) directly is routed as that
	// adapter; any other model is the base model.
	Adapters map[string]string
	// Fallbacks is the number of endpoints listed after the picked one,
	// cheapest first, for Envoy to retry on. Zero means DefaultFallbacks;
	// negative means none.
	Fallbacks int
	// MaxBodyBytes bounds a request body, and the part of a JSON response
	// body read for its usage. Zero means DefaultMaxBodyBytes. Larger
	// requests are answered with 413.
	MaxBodyBytes int
	// InjectUsage makes the picker add stream_options.include_usage to
	// streamed requests that did not ask for it, so that the engine
	// reports the cached tokens in a last chunk, and removes that chunk
	// from the stream the client sees. Without it, streamed requests
	// whose client did not ask for usage end without the engine's cached
	// tokens (routing accuracy then counts only the others).
	InjectUsage bool
	// Logger receives a record per rejected request and per protocol
	// problem (warn), and one per decision at debug level. Nil discards.
	Logger *slog.Logger
}

// Server is an Envoy ext_proc ExternalProcessor that picks, for each
// request, the endpoint of an InferencePool holding the longest cached
// prefix of its prompt, following GIE's Endpoint Picker Protocol.
//
// Concurrency: Process runs once per HTTP request, concurrently; each call
// handles its stream on the calling goroutine. SetReady, Stats and the
// health service are safe from any goroutine.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg    Config
	log    *slog.Logger
	health *health.Server
	ready  atomic.Bool
	stats  counters
	// adapters is the set of LoRA adapter names (Config.Adapters' values).
	adapters map[string]bool
}

// New returns a Server for cfg. It reports itself live but not ready:
// the host calls SetReady(true) once the endpoints are known.
func New(cfg Config) (*Server, error) {
	if cfg.Router == nil || cfg.Endpoints == nil || cfg.Tokenizer == nil {
		return nil, fmt.Errorf("%w: Router, Endpoints and Tokenizer are required", ErrConfig)
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("%w: negative MaxBodyBytes", ErrConfig)
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	switch {
	case cfg.Fallbacks == 0:
		cfg.Fallbacks = DefaultFallbacks
	case cfg.Fallbacks < 0:
		cfg.Fallbacks = 0
	}
	models := make(map[string]string, len(cfg.Adapters))
	adapters := make(map[string]bool, len(cfg.Adapters))
	for k, v := range cfg.Adapters {
		if v == "" {
			return nil, fmt.Errorf("%w: model %q maps to an empty adapter name", ErrConfig, k)
		}
		models[k], adapters[v] = v, true
	}
	cfg.Adapters = models
	s := &Server{cfg: cfg, log: cfg.Logger, health: health.NewServer(), adapters: adapters}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.health.SetServingStatus(ServiceLiveness, healthpb.HealthCheckResponse_SERVING)
	s.SetReady(false)
	return s, nil
}

// Register registers the ext_proc service and the gRPC health service on
// g.
func (s *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
}

// Health returns the gRPC health server, for hosts that register it
// themselves.
func (s *Server) Health() *health.Server { return s.health }

// SetReady sets the readiness the health service reports (services
// ServiceReadiness, the ext_proc service and ""). Liveness is always
// SERVING. A picker that is not ready still answers requests: readiness
// only steers Kubernetes and Envoy's health checks.
func (s *Server) SetReady(ready bool) {
	s.ready.Store(ready)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, svc := range []string{ServiceReadiness, extprocv3.ExternalProcessor_ServiceDesc.ServiceName, ""} {
		s.health.SetServingStatus(svc, st)
	}
}

// Ready reports the readiness last set.
func (s *Server) Ready() bool { return s.ready.Load() }

// Process implements extprocv3.ExternalProcessorServer: it handles one
// HTTP request's stream of ext_proc messages (see the package doc for the
// sequence) and returns when Envoy closes it.
//
// A panic while handling the stream (in the picker or in the host's
// Tokenizer) ends that stream alone with codes.Internal, is logged with
// its stack and counted in Stats.Panics, and balances the routing
// decision if one was made; the server goes on serving the others, where
// gRPC would let the panic take the whole process down.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) (err error) {
	st := &exchange{s: s, stream: stream, ctx: stream.Context()}
	defer func() {
		if p := recover(); p != nil {
			s.stats.panics.Add(1)
			s.log.Error("epp: panic while handling a request", "panic", p, "stack", string(debug.Stack()))
			st.abandon()
			err = status.Errorf(codes.Internal, "epp: internal error handling the request")
		}
	}()
	return st.run()
}
