package gateway

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute"
)

// ErrEngineConfig is wrapped by errors about an engine's description.
var ErrEngineConfig = errors.New("gateway: invalid engine")

// Engine describes one OpenAI-compatible inference engine behind the
// gateway. The JSON names are those of the gateway's configuration file.
type Engine struct {
	// ID is the engine's worker id in the router; unique per gateway.
	ID kvroute.WorkerID `json:"id"`
	// URL is the engine's HTTP base URL, such as "http://10.0.0.7:8000";
	// request paths (/v1/completions) are appended to it.
	URL string `json:"url"`
	// Events is the engine's ZMQ KV-event PUB endpoint, such as
	// "tcp://10.0.0.7:5557" (vLLM --kv-events-config endpoint). Empty means
	// the engine publishes no events: the router then knows nothing of its
	// cache (use a router in approximate mode for such pools).
	Events string `json:"events,omitempty"`
	// Replay is the engine's ZMQ replay endpoint (vLLM's
	// replay_endpoint), used to repair gaps. Empty disables replay.
	Replay string `json:"replay,omitempty"`
	// Topic is the event topic to subscribe to. Empty receives every
	// topic.
	Topic string `json:"topic,omitempty"`
	// Ranks is the number of data-parallel ranks, each its own cache
	// domain. Rank r publishes on the Events and Replay ports plus r, as
	// vLLM does, and is addressed with the X-Data-Parallel-Rank header.
	// Zero means 1.
	Ranks int `json:"ranks,omitempty"`
	// MaxRequests, MaxBatchedTokens and KVCapacityBlocks are the engine's
	// capacities (router.Capacity); zero means unknown.
	MaxRequests      int `json:"max_requests,omitempty"`
	MaxBatchedTokens int `json:"max_batched_tokens,omitempty"`
	KVCapacityBlocks int `json:"kv_capacity_blocks,omitempty"`
}

// ParseEngine parses an engine given on the command line:
//
//	ID=URL[,events=ENDPOINT][,replay=ENDPOINT][,topic=T][,ranks=N]
//	      [,max-requests=N][,max-batched-tokens=N][,kv-blocks=N]
//
// for example "1=http://127.0.0.1:8000,events=tcp://127.0.0.1:5557".
// "zmq" is accepted as another name of "events". Errors wrap
// ErrEngineConfig.
func ParseEngine(spec string) (Engine, error) {
	var e Engine
	parts := strings.Split(spec, ",")
	id, u, ok := strings.Cut(parts[0], "=")
	if !ok {
		return e, fmt.Errorf("%w: %q does not start with ID=URL", ErrEngineConfig, spec)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(id), 10, 64)
	if err != nil {
		return e, fmt.Errorf("%w: id %q: %w", ErrEngineConfig, id, err)
	}
	e.ID, e.URL = kvroute.WorkerID(n), strings.TrimSpace(u)
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return e, fmt.Errorf("%w: option %q is not key=value", ErrEngineConfig, p)
		}
		v = strings.TrimSpace(v)
		var num *int
		switch strings.TrimSpace(k) {
		case "events", "zmq":
			e.Events = v
		case "replay":
			e.Replay = v
		case "topic":
			e.Topic = v
		case "ranks":
			num = &e.Ranks
		case "max-requests":
			num = &e.MaxRequests
		case "max-batched-tokens":
			num = &e.MaxBatchedTokens
		case "kv-blocks":
			num = &e.KVCapacityBlocks
		default:
			return e, fmt.Errorf("%w: unknown option %q", ErrEngineConfig, k)
		}
		if num != nil {
			if *num, err = strconv.Atoi(v); err != nil {
				return e, fmt.Errorf("%w: %s: %w", ErrEngineConfig, k, err)
			}
		}
	}
	return e, e.validate()
}

// validate checks the engine's fields.
func (e *Engine) validate() error {
	u, err := url.Parse(e.URL)
	if err != nil {
		return fmt.Errorf("%w: engine %d: url: %w", ErrEngineConfig, e.ID, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: engine %d: url %q is not http(s)://host[:port]", ErrEngineConfig, e.ID, e.URL)
	}
	if e.Ranks < 0 || e.MaxRequests < 0 || e.MaxBatchedTokens < 0 || e.KVCapacityBlocks < 0 {
		return fmt.Errorf("%w: engine %d: negative ranks or capacity", ErrEngineConfig, e.ID)
	}
	if e.Replay != "" && e.Events == "" {
		return fmt.Errorf("%w: engine %d: replay endpoint without an events endpoint", ErrEngineConfig, e.ID)
	}
	if e.Ranks > maxRanks {
		return fmt.Errorf("%w: engine %d: %d ranks (at most %d)", ErrEngineConfig, e.ID, e.Ranks, maxRanks)
	}
	for r := range max(e.Ranks, 1) {
		for _, ep := range []string{e.Events, e.Replay} {
			if _, err := rankEndpoint(ep, r); err != nil {
				return fmt.Errorf("%w: engine %d: %w", ErrEngineConfig, e.ID, err)
			}
		}
	}
	return nil
}

// maxRanks bounds an engine's data-parallel ranks: each rank publishes on
// its own port.
const maxRanks = 1 << 16

// rankEndpoint returns the ZMQ endpoint of data-parallel rank r: the
// endpoint's port plus r. Rank 0 and an empty endpoint are returned as is.
func rankEndpoint(ep string, r int) (string, error) {
	if ep == "" || r == 0 {
		return ep, nil
	}
	i := strings.LastIndexByte(ep, ':')
	port, err := strconv.Atoi(ep[i+1:])
	if i < 0 || err != nil || port+r > 65535 {
		return "", fmt.Errorf("endpoint %q has no port to offset for rank %d", ep, r)
	}
	return ep[:i+1] + strconv.Itoa(port+r), nil
}
