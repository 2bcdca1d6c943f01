package dynamo

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
)

// The store's buckets: key prefixes in etcd, directories under the file
// store's root.
const (
	BucketInstances     = "v1/instances"
	BucketModels        = "v1/mdc"
	BucketEventChannels = "v1/event_channels"
	BucketEventSources  = "v1/event_sources"
)

// Buckets lists the buckets a watcher reads.
var Buckets = [...]string{BucketInstances, BucketModels, BucketEventChannels, BucketEventSources}

// The event-plane topics discovery reads.
const (
	// TopicKVEvents carries the workers' KV-cache events (RouterEvents).
	TopicKVEvents = "kv-events"
	// TopicKVMetrics carries the workers' load (ActiveLoad: worker id,
	// dp rank, active decode blocks, prefill tokens, used KV blocks).
	TopicKVMetrics = "kv_metrics"
	// TopicForwardPassMetrics carries each forward pass's scheduler
	// figures (about once a second when idle); its messages name the
	// worker too.
	TopicForwardPassMetrics = "forward-pass-metrics"
)

// ErrValue is wrapped by errors about a value or key read from the store.
var ErrValue = errors.New("dynamo: invalid store value")

// EndpointID names a Dynamo endpoint: namespace, component and endpoint
// name ("dynamo", "backend", "generate").
type EndpointID struct {
	Namespace string `json:"namespace"`
	Component string `json:"component"`
	Name      string `json:"name"`
}

// String returns "namespace/component/name".
func (e EndpointID) String() string { return e.Namespace + "/" + e.Component + "/" + e.Name }

func (e EndpointID) validate() error {
	if e.Namespace == "" || e.Component == "" || e.Name == "" {
		return fmt.Errorf("%w: endpoint %q lacks a namespace, component or name", ErrValue, e.String())
	}
	return nil
}

// Transport is a request-plane address: Kind is "tcp", "http" or
// "nats_tcp" and Address what Dynamo's clients dial or publish to
// ("127.0.0.1:33027/<id hex>/dynamo/backend/generate" for tcp).
type Transport struct {
	Kind    string
	Address string
}

// Instance is a value of the instances bucket: one endpoint served by one
// process (Dynamo's Instance, "type":"Endpoint").
type Instance struct {
	Endpoint EndpointID
	// ID is instance_id, the worker's id: the router's worker id and the
	// value of the x-dynamo-worker-instance-id header.
	ID        uint64
	Transport Transport
	// DeviceType is device_type ("cuda", "cpu"), Codec
	// request_plane_codec ("msgpack", "json"); both may be empty.
	DeviceType string
	Codec      string
}

// ModelCard is a value of the mdc bucket: the model deployment card an
// instance serves ("type":"Model").
type ModelCard struct {
	Endpoint   EndpointID
	InstanceID uint64
	// Suffix is model_suffix: empty for the base model, the adapter's
	// name for a LoRA card.
	Suffix string
	// Name is the card's display_name, Slug its slug.
	Name, Slug string
	// BlockSize is kv_cache_block_size, in tokens.
	BlockSize int
	// KVBlocks is runtime_config.total_kv_blocks: the KV cache's size in
	// blocks per data-parallel rank; zero if the card does not say.
	KVBlocks int
	// MaxRequests and MaxBatchedTokens are runtime_config.max_num_seqs and
	// max_num_batched_tokens; zero if unknown.
	MaxRequests, MaxBatchedTokens int
	// DPStart and DPSize are runtime_config.data_parallel_start_rank and
	// data_parallel_size (at least 1): the instance serves ranks DPStart
	// to DPStart+DPSize-1.
	DPStart, DPSize int
	// WorkerType is worker_type ("aggregated", "prefill", "decode"; empty
	// if absent).
	WorkerType string
	// PublishesKVEvents is runtime_config.kv_event_publishing_enabled: the
	// instance registers a kv-events publisher per rank.
	PublishesKVEvents bool
}

// Scope is the owner of an event channel: Kind "endpoint" (Namespace,
// Component and Endpoint set), "component" (Namespace and Component) or
// "namespace" (Namespace).
type Scope struct {
	Kind                           string
	Namespace, Component, Endpoint string
}

// Contains reports whether an endpoint lies in the scope.
func (s Scope) Contains(e EndpointID) bool {
	switch s.Kind {
	case "endpoint":
		return s.Namespace == e.Namespace && s.Component == e.Component && s.Endpoint == e.Name
	case "component":
		return s.Namespace == e.Namespace && s.Component == e.Component
	default:
		return s.Namespace == e.Namespace
	}
}

// Channel is a value of the event_channels bucket: one publisher of a
// topic and where to subscribe ("type":"EventChannel").
type Channel struct {
	Scope Scope
	Topic string
	// PublisherID is the channel's instance_id: the publisher's id, which
	// its frames carry and the event_sources bucket maps to a worker.
	PublisherID uint64
	// Transport is "Zmq" (Endpoints holds the PUB endpoint,
	// "tcp://127.0.0.1:41569"), "ZmqBroker" (the broker's XPUB endpoints)
	// or "Nats" (Endpoints holds the subject prefix).
	Transport string
	Endpoints []string
}

// Source is a value of the event_sources bucket: which worker and
// data-parallel rank a publisher speaks for ("type":"EventSource").
type Source struct {
	Scope       Scope
	Topic       string
	PublisherID uint64
	WorkerID    uint64
	DPRank      int
	// Recovery is the request-plane address of the worker's KV query
	// endpoint (metadata.recovery_target), from which a subscriber can
	// fetch the worker's cache and the events it missed; nil if the
	// record names none. A "tcp" address is "host:port/path".
	Recovery *Transport
}

// Record is one decoded store value: exactly one field is set.
type Record struct {
	Instance *Instance
	Model    *ModelCard
	Channel  *Channel
	Source   *Source
}

// The JSON shapes Dynamo 1.6 writes (serde of DiscoveryInstance).
type (
	wireEndpoint struct {
		Namespace string `json:"namespace"`
		Component string `json:"component"`
		Endpoint  string `json:"endpoint"`
	}
	wireValue struct {
		Type string `json:"type"`
		wireEndpoint
		InstanceID  *uint64           `json:"instance_id"`
		Transport   json.RawMessage   `json:"transport"`
		DeviceType  string            `json:"device_type"`
		Codec       string            `json:"request_plane_codec"`
		ModelSuffix string            `json:"model_suffix"`
		Card        *wireCard         `json:"card_json"`
		Scope       *wireScope        `json:"scope"`
		Topic       string            `json:"topic"`
		PublisherID *uint64           `json:"publisher_id"`
		Metadata    *wireSourceDetail `json:"metadata"`
	}
	wireCard struct {
		DisplayName string `json:"display_name"`
		Slug        string `json:"slug"`
		BlockSize   *int   `json:"kv_cache_block_size"`
		WorkerType  string `json:"worker_type"`
		Runtime     struct {
			TotalKVBlocks    *int  `json:"total_kv_blocks"`
			MaxNumSeqs       *int  `json:"max_num_seqs"`
			MaxBatchedTokens *int  `json:"max_num_batched_tokens"`
			DPStart          *int  `json:"data_parallel_start_rank"`
			DPSize           *int  `json:"data_parallel_size"`
			KVEvents         *bool `json:"kv_event_publishing_enabled"`
		} `json:"runtime_config"`
	}
	wireScope struct {
		Kind      string      `json:"kind"`
		Name      string      `json:"name"`
		Namespace string      `json:"namespace"`
		Component string      `json:"component"`
		Endpoint  *EndpointID `json:"endpoint"`
	}
	wireSourceDetail struct {
		Worker *struct {
			WorkerID *uint64 `json:"worker_id"`
			DPRank   *int    `json:"dp_rank"`
		} `json:"worker"`
		Recovery *struct {
			Transport map[string]string `json:"transport"`
		} `json:"recovery_target"`
	}
	wireEventTransport struct {
		Kind   string `json:"kind"`
		Config struct {
			Endpoint      string   `json:"endpoint"`
			SubjectPrefix string   `json:"subject_prefix"`
			XPub          []string `json:"xpub_endpoints"`
		} `json:"config"`
	}
)

// maxRank bounds the data-parallel ranks a card or source may name.
const maxRank = 1 << 16

// Decode reads one store value (Dynamo's JSON DiscoveryInstance).
// Errors wrap ErrValue; a value of a type discovery does not use is an
// error too.
func Decode(value []byte) (Record, error) {
	var v wireValue
	if err := json.Unmarshal(value, &v); err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrValue, err)
	}
	switch v.Type {
	case "Endpoint":
		in, err := v.instance()
		return Record{Instance: in}, err
	case "Model":
		m, err := v.model()
		return Record{Model: m}, err
	case "EventChannel":
		c, err := v.channel()
		return Record{Channel: c}, err
	case "EventSource":
		s, err := v.source()
		return Record{Source: s}, err
	}
	return Record{}, fmt.Errorf("%w: unknown type %q", ErrValue, v.Type)
}

func (v *wireValue) endpoint() (EndpointID, error) {
	e := EndpointID{Namespace: v.Namespace, Component: v.Component, Name: v.Endpoint}
	return e, e.validate()
}

func (v *wireValue) id(field string, p *uint64) (uint64, error) {
	if p == nil || *p == 0 {
		return 0, fmt.Errorf("%w: %s value without a %s", ErrValue, v.Type, field)
	}
	return *p, nil
}

// endpointAndID returns the endpoint and instance id of an Endpoint or
// Model value.
func (v *wireValue) endpointAndID() (EndpointID, uint64, error) {
	e, err := v.endpoint()
	if err != nil {
		return e, 0, err
	}
	id, err := v.id("instance_id", v.InstanceID)
	return e, id, err
}

// scopeAndID returns the scope and the id in field of an EventChannel or
// EventSource value.
func (v *wireValue) scopeAndID(field string, p *uint64) (Scope, uint64, error) {
	sc, err := v.scope()
	if err != nil {
		return sc, 0, err
	}
	id, err := v.id(field, p)
	return sc, id, err
}

func (v *wireValue) instance() (*Instance, error) {
	e, id, err := v.endpointAndID()
	if err != nil {
		return nil, err
	}
	var t map[string]string
	if err := json.Unmarshal(v.Transport, &t); err != nil || len(t) != 1 {
		return nil, fmt.Errorf("%w: instance %x: transport %s is not one {kind: address}", ErrValue, id, v.Transport)
	}
	in := &Instance{Endpoint: e, ID: id, DeviceType: v.DeviceType, Codec: v.Codec}
	for k, a := range t {
		in.Transport = Transport{Kind: k, Address: a}
	}
	if err := checkTCP(&in.Transport); err != nil {
		return nil, fmt.Errorf("%w: instance %x: %w", ErrValue, id, err)
	}
	return in, nil
}

func (v *wireValue) model() (*ModelCard, error) {
	e, id, err := v.endpointAndID()
	if err != nil {
		return nil, err
	}
	c := v.Card
	if c == nil || c.DisplayName == "" {
		return nil, fmt.Errorf("%w: model card of %x without card_json.display_name", ErrValue, id)
	}
	if c.BlockSize == nil || *c.BlockSize < 1 || *c.BlockSize > 1<<20 {
		return nil, fmt.Errorf("%w: model card of %x: kv_cache_block_size missing or out of range", ErrValue, id)
	}
	r := &c.Runtime
	m := &ModelCard{Endpoint: e, InstanceID: id, Suffix: v.ModelSuffix, Name: c.DisplayName, Slug: c.Slug,
		BlockSize: *c.BlockSize, WorkerType: c.WorkerType, DPSize: 1}
	for _, f := range []struct {
		dst  *int
		src  *int
		name string
		max  int
	}{
		{&m.KVBlocks, r.TotalKVBlocks, "total_kv_blocks", 1 << 40},
		{&m.MaxRequests, r.MaxNumSeqs, "max_num_seqs", 1 << 40},
		{&m.MaxBatchedTokens, r.MaxBatchedTokens, "max_num_batched_tokens", 1 << 40},
		{&m.DPStart, r.DPStart, "data_parallel_start_rank", maxRank},
		{&m.DPSize, r.DPSize, "data_parallel_size", maxRank},
	} {
		if f.src == nil {
			continue
		}
		if *f.src < 0 || *f.src > f.max {
			return nil, fmt.Errorf("%w: model card of %x: %s %d out of range", ErrValue, id, f.name, *f.src)
		}
		*f.dst = *f.src
	}
	m.DPSize = max(m.DPSize, 1)
	m.PublishesKVEvents = r.KVEvents != nil && *r.KVEvents
	return m, nil
}

func (v *wireValue) scope() (Scope, error) {
	s := v.Scope
	if s == nil {
		return Scope{}, fmt.Errorf("%w: %s value without a scope", ErrValue, v.Type)
	}
	var out Scope
	switch s.Kind {
	case "endpoint":
		if s.Endpoint == nil {
			return out, fmt.Errorf("%w: endpoint scope without an endpoint", ErrValue)
		}
		if err := s.Endpoint.validate(); err != nil {
			return out, err
		}
		out = Scope{Kind: s.Kind, Namespace: s.Endpoint.Namespace, Component: s.Endpoint.Component, Endpoint: s.Endpoint.Name}
	case "component":
		out = Scope{Kind: s.Kind, Namespace: s.Namespace, Component: s.Component}
		if out.Namespace == "" || out.Component == "" {
			return out, fmt.Errorf("%w: component scope lacks a namespace or component", ErrValue)
		}
	case "namespace":
		out = Scope{Kind: s.Kind, Namespace: s.Name}
		if out.Namespace == "" {
			return out, fmt.Errorf("%w: namespace scope without a name", ErrValue)
		}
	default:
		return out, fmt.Errorf("%w: unknown scope kind %q", ErrValue, s.Kind)
	}
	if v.Topic == "" {
		return out, fmt.Errorf("%w: %s value without a topic", ErrValue, v.Type)
	}
	return out, nil
}

func (v *wireValue) channel() (*Channel, error) {
	sc, id, err := v.scopeAndID("instance_id", v.InstanceID)
	if err != nil {
		return nil, err
	}
	var t wireEventTransport
	if err := json.Unmarshal(v.Transport, &t); err != nil {
		return nil, fmt.Errorf("%w: channel %x: transport: %w", ErrValue, id, err)
	}
	c := &Channel{Scope: sc, Topic: v.Topic, PublisherID: id, Transport: t.Kind}
	switch t.Kind {
	case "Zmq":
		c.Endpoints = []string{t.Config.Endpoint}
	case "ZmqBroker":
		c.Endpoints = t.Config.XPub
	case "Nats":
		c.Endpoints = []string{t.Config.SubjectPrefix}
	default:
		return nil, fmt.Errorf("%w: channel %x: unknown transport kind %q", ErrValue, id, t.Kind)
	}
	if len(c.Endpoints) == 0 || slicesHasEmpty(c.Endpoints) {
		return nil, fmt.Errorf("%w: channel %x: %s transport without an address", ErrValue, id, t.Kind)
	}
	return c, nil
}

func slicesHasEmpty(s []string) bool {
	for _, x := range s {
		if strings.TrimSpace(x) == "" {
			return true
		}
	}
	return false
}

func (v *wireValue) source() (*Source, error) {
	sc, id, err := v.scopeAndID("publisher_id", v.PublisherID)
	if err != nil {
		return nil, err
	}
	if v.Metadata == nil || v.Metadata.Worker == nil {
		return nil, fmt.Errorf("%w: event source %x without metadata.worker", ErrValue, id)
	}
	w := v.Metadata.Worker
	worker, err := v.id("metadata.worker.worker_id", w.WorkerID)
	if err != nil {
		return nil, err
	}
	rank := 0
	if w.DPRank != nil {
		rank = *w.DPRank
	}
	if rank < 0 || rank >= maxRank {
		return nil, fmt.Errorf("%w: event source %x: dp_rank %d out of range", ErrValue, id, rank)
	}
	src := &Source{Scope: sc, Topic: v.Topic, PublisherID: id, WorkerID: worker, DPRank: rank}
	if rt := v.Metadata.Recovery; rt != nil {
		if len(rt.Transport) != 1 {
			return nil, fmt.Errorf("%w: event source %x: recovery transport is not one {kind: address}", ErrValue, id)
		}
		for k, a := range rt.Transport {
			src.Recovery = &Transport{Kind: k, Address: a}
		}
		if err := checkTCP(src.Recovery); err != nil {
			return nil, fmt.Errorf("%w: event source %x: recovery %w", ErrValue, id, err)
		}
	}
	return src, nil
}

// checkTCP checks a tcp request-plane address: "host:port/path".
func checkTCP(t *Transport) error {
	if t.Address == "" {
		return fmt.Errorf("transport %s without an address", t.Kind)
	}
	if t.Kind != "tcp" {
		return nil
	}
	hostPort, path, ok := strings.Cut(t.Address, "/")
	if !ok || path == "" {
		return fmt.Errorf("tcp address %q is not host:port/path", t.Address)
	}
	if _, _, err := net.SplitHostPort(hostPort); err != nil {
		return fmt.Errorf("tcp address %q: %w", t.Address, err)
	}
	return nil
}
