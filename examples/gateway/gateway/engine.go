package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"

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
	// vLLM does, and is addressed with the X-Data-Parallel-Rank header
	// (or the rank header of Headers or Preset). Zero means 1.
	Ranks int `json:"ranks,omitempty"`
	// Headers are set on every request forwarded to the engine, replacing
	// the client's headers of the same names. In a value, "{id}" stands
	// for the engine's worker id and "{rank}" for the data-parallel rank
	// the router chose. They let several engines share one URL: a
	// frontend that picks the worker a header names, such as Dynamo's
	// frontend in direct routing mode.
	Headers map[string]string `json:"headers,omitempty"`
	// Preset adds the headers of a known frontend to Headers (which win
	// on a name both set): PresetDynamo. Empty adds none.
	Preset string `json:"preset,omitempty"`
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
//	      [,preset=NAME][,header=NAME:VALUE]...
//
// for example "1=http://127.0.0.1:8000,events=tcp://127.0.0.1:5557", or
// "6102808441099218236=http://127.0.0.1:8000,preset=dynamo" for a worker
// behind Dynamo's frontend. "zmq" is accepted as another name of
// "events"; header may repeat (a value cannot hold a comma). Errors wrap
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
		case "preset":
			e.Preset = v
		case "header":
			name, value, ok := strings.Cut(v, ":")
			if !ok {
				return e, fmt.Errorf("%w: header %q is not NAME:VALUE", ErrEngineConfig, v)
			}
			if e.Headers == nil {
				e.Headers = map[string]string{}
			}
			e.Headers[strings.TrimSpace(name)] = strings.TrimSpace(value)
		default:
			return e, fmt.Errorf("%w: unknown option %q", ErrEngineConfig, k)
		}
		if num != nil {
			if *num, err = strconv.Atoi(v); err != nil {
				return e, fmt.Errorf("%w: %s: %w", ErrEngineConfig, k, err)
			}
		}
	}
	return e, e.Validate()
}

// Validate checks the engine's fields as New and AddEngine do. Errors
// wrap ErrEngineConfig.
func (e *Engine) Validate() error {
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
	if _, err := e.headers(); err != nil {
		return fmt.Errorf("%w: engine %d: %w", ErrEngineConfig, e.ID, err)
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
	if i < 0 {
		return "", fmt.Errorf("endpoint %q has no port to offset for rank %d", ep, r)
	}
	port, err := strconv.ParseUint(ep[i+1:], 10, 16)
	if err != nil || port == 0 {
		return "", fmt.Errorf("endpoint %q has no port to offset for rank %d: %q is not 1 to 65535", ep, r, ep[i+1:])
	}
	if int(port)+r > 65535 {
		return "", fmt.Errorf("endpoint %q has no port to offset for rank %d: %d + %d is beyond 65535", ep, r, port, r)
	}
	return ep[:i+1] + strconv.Itoa(int(port)+r), nil
}

// PresetDynamo is the Preset of a worker behind NVIDIA Dynamo's frontend
// started with --router-mode direct: every engine of a Dynamo deployment
// shares the frontend's URL, and the frontend serves a request on the
// worker instance named by the x-dynamo-worker-instance-id header (the
// Engine's ID, Dynamo's instance id) and the data-parallel rank of
// x-dynamo-dp-rank. The gateway also removes the client's other Dynamo
// routing headers (prefill worker, rank aliases), so that a client cannot
// override the router's choice, and sends the prompt's token ids in the
// body ("nvext": {"token_data": [...]}), which the frontend then takes as
// the prompt instead of tokenizing it again: the worker computes on
// exactly the tokens the router matched, and the prompt is tokenized once.
// A multimodal prompt is sent without them, for the frontend to process.
const PresetDynamo = "dynamo"

// Dynamo's routing headers (its frontend's names; the unprefixed ones are
// its compatibility aliases).
const (
	HeaderDynamoWorker = "X-Dynamo-Worker-Instance-Id"
	HeaderDynamoDPRank = "X-Dynamo-Dp-Rank"
)

// preset is a known frontend's header scheme.
type preset struct {
	set   map[string]string // headers to set (templates)
	strip []string          // client headers to remove
	// refused reports whether an answer is the frontend refusing the
	// routing headers (the worker they name is unknown to it): the
	// attempt then fails and the request moves to another engine. Nil
	// means never.
	refused func(status int, body []byte) bool
	// tokenData is set when the frontend takes the prompt's token ids
	// from the body ("nvext": {"token_data": [...]}) instead of
	// tokenizing the prompt again.
	tokenData bool
}

// dynamoRefused recognises Dynamo's answer to a request naming a worker
// instance its frontend does not know (gone, or never there): 400 with
// the message "Invalid request". Malformed bodies get 400 with a message
// saying what is wrong, and are relayed to the client.
func dynamoRefused(status int, body []byte) bool {
	if status != http.StatusBadRequest {
		return false
	}
	var e struct {
		Message string `json:"message"`
	}
	return json.Unmarshal(body, &e) == nil && e.Message == "Invalid request"
}

var presets = map[string]preset{
	PresetDynamo: {
		set: map[string]string{HeaderDynamoWorker: "{id}", HeaderDynamoDPRank: "{rank}"},
		strip: []string{
			"X-Dynamo-Prefill-Instance-Id", "X-Dynamo-Prefill-Dp-Rank", "X-Dynamo-Routing-Mode",
			"X-Worker-Instance-Id", "X-Prefill-Instance-Id", "X-Dp-Rank", "X-Data-Parallel-Rank", "X-Prefill-Dp-Rank",
		},
		refused:   dynamoRefused,
		tokenData: true,
	},
}

// headerField is one header an engine's requests carry: its canonical
// name and its value template.
type headerField struct {
	name, value string
}

// headerDPRank is the header that names a data-parallel rank to vLLM.
const headerDPRank = "X-Data-Parallel-Rank"

// engineHeaders are the compiled Headers and Preset of an engine.
type engineHeaders struct {
	set        []headerField
	strip      []string
	refused    func(status int, body []byte) bool
	tokenData  bool // send the prompt's token ids (preset.tokenData)
	rankHeader bool // a header of set names the rank ("{rank}")
}

// headers compiles e's Headers and Preset, checking names and values.
func (e *Engine) headers() (engineHeaders, error) {
	var h engineHeaders
	merged := map[string]string{}
	if e.Preset != "" {
		p, ok := presets[e.Preset]
		if !ok {
			return h, fmt.Errorf("unknown preset %q (known: %s)", e.Preset, strings.Join(slices.Sorted(maps.Keys(presets)), ", "))
		}
		maps.Copy(merged, p.set)
		h.strip, h.refused, h.tokenData = p.strip, p.refused, p.tokenData
	}
	own := map[string]bool{}
	for name, value := range e.Headers {
		if !httpguts.ValidHeaderFieldName(name) {
			return h, fmt.Errorf("invalid header name %q", name)
		}
		if !httpguts.ValidHeaderFieldValue(value) {
			return h, fmt.Errorf("header %s: invalid value %q", name, value)
		}
		name = http.CanonicalHeaderKey(name)
		if own[name] {
			return h, fmt.Errorf("header %s given twice", name)
		}
		own[name], merged[name] = true, value
	}
	for _, name := range slices.Sorted(maps.Keys(merged)) {
		h.set = append(h.set, headerField{name: name, value: merged[name]})
		h.rankHeader = h.rankHeader || strings.Contains(merged[name], "{rank}")
	}
	return h, nil
}

// apply sets the headers on a request to cache domain (id, rank): removes
// the stripped client headers, then sets each template expanded.
func (h *engineHeaders) apply(dst http.Header, id kvroute.WorkerID, rank kvroute.DPRank) {
	for _, name := range h.strip {
		dst.Del(name)
	}
	for _, f := range h.set {
		dst[f.name] = []string{expandHeader(f.value, id, rank)}
	}
}

// expandHeader replaces "{id}" and "{rank}" in a header template.
func expandHeader(tmpl string, id kvroute.WorkerID, rank kvroute.DPRank) string {
	if !strings.Contains(tmpl, "{") {
		return tmpl
	}
	return strings.NewReplacer("{id}", strconv.FormatUint(uint64(id), 10), "{rank}", strconv.Itoa(int(rank))).Replace(tmpl)
}
