package dynamo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
)

// ErrIncomplete is wrapped by the reasons a worker is not ready yet
// (Deployment.Waiting): its model card, instance or kv-events publisher
// is not in the store, or it has a shape kvroute does not route.
var ErrIncomplete = errors.New("dynamo: worker not ready")

// Selector picks the workers of one deployment. Empty fields match
// everything; a router serves one model, so set Model when the store
// holds several.
type Selector struct {
	// Namespace, Component and Endpoint name the workers' endpoint
	// ("dynamo", "backend", "generate").
	Namespace, Component, Endpoint string
	// Model is the served model's name (the card's display_name or
	// slug).
	Model string
}

func (s *Selector) matches(m *ModelCard) bool {
	e := m.Endpoint
	return (s.Namespace == "" || s.Namespace == e.Namespace) &&
		(s.Component == "" || s.Component == e.Component) &&
		(s.Endpoint == "" || s.Endpoint == e.Name) &&
		(s.Model == "" || s.Model == m.Name || s.Model == m.Slug)
}

// Publisher is one kv-events publisher of a worker.
type Publisher struct {
	// ID is the publisher id its frames carry.
	ID uint64
	// DPRank is the data-parallel rank it publishes for, as Dynamo
	// numbers ranks: from the worker's DPStart.
	DPRank int
	// Transport and Endpoints are those of its Channel ("Zmq" and the
	// PUB endpoint).
	Transport string
	Endpoints []string
	// Recovery is the worker's KV query endpoint for this rank (see
	// Source.Recovery), or nil.
	Recovery *Transport
}

// Worker is one Dynamo worker as the store describes it: an instance
// serving a model card.
type Worker struct {
	// InstanceID is the worker's id in Dynamo: use it as the router's
	// worker id, so that a choice can be forwarded as the
	// x-dynamo-worker-instance-id header.
	InstanceID uint64
	// Endpoint is the endpoint it serves, Model the model's name.
	Endpoint EndpointID
	Model    string
	// BlockSize is its KV block size in tokens; KVBlocks its cache size
	// in blocks per rank (zero if unknown); MaxRequests and
	// MaxBatchedTokens its batch limits (zero if unknown).
	BlockSize, KVBlocks           int
	MaxRequests, MaxBatchedTokens int
	// DPStart and DPSize are its data-parallel ranks: Dynamo's ranks
	// DPStart to DPStart+DPSize-1 (DPStart is above 0 for the workers
	// after the first of a multi-node data-parallel deployment), which a
	// router models as ranks 0 to DPSize-1 (see Engine).
	DPStart, DPSize int
	// WorkerType is "aggregated", "prefill" or "decode" (empty if the
	// card does not say).
	WorkerType string
	// RequestPlane is where Dynamo's clients send it requests.
	RequestPlane Transport
	// KVEvents are its kv-events publishers, sorted by rank and id.
	KVEvents []Publisher
	// Metrics are its kv_metrics and forward-pass-metrics channels when
	// the store ties them to the worker (etcd: the same lease); see
	// Deployment.Metrics.
	Metrics []Channel
}

// Deployment is what a Selector picks in the store.
type Deployment struct {
	// Workers are the ready workers, sorted by InstanceID.
	Workers []Worker
	// Metrics are the kv_metrics and forward-pass-metrics channels in
	// the workers' scopes, sorted by topic and publisher. The file store
	// does not say which worker such a publisher belongs to; its messages
	// name the worker (worker_id, dp_rank).
	Metrics []Channel
	// Waiting holds the instances with a model card that are not ready,
	// with why (errors wrap ErrIncomplete).
	Waiting map[uint64]error
}

// entry is one key's decoded value and its lease (zero: none known).
type entry struct {
	rec   Record
	lease int64
}

// State is a snapshot of the store: decoded values by key. The zero value
// is empty and ready; a State is not safe for concurrent use.
type State struct {
	entries map[string]entry
}

// Put stores key's value; an invalid value is an error and removes the
// key, so that a worker whose record went bad is not routed to with stale
// data. Keys outside the buckets are ignored. lease is the key's etcd
// lease, zero for none.
func (s *State) Put(key string, value []byte, lease int64) error {
	if bucketOf(key) == "" {
		return nil
	}
	rec, err := Decode(value)
	if err != nil {
		s.Delete(key)
		return fmt.Errorf("%s: %w", key, err)
	}
	if s.entries == nil {
		s.entries = map[string]entry{}
	}
	s.entries[key] = entry{rec: rec, lease: lease}
	return nil
}

// Delete removes key.
func (s *State) Delete(key string) { delete(s.entries, key) }

// Len returns the number of keys held.
func (s *State) Len() int { return len(s.entries) }

// bucketOf returns the bucket key is in, or "".
func bucketOf(key string) string {
	for _, b := range Buckets {
		if strings.HasPrefix(key, b+"/") {
			return b
		}
	}
	return ""
}

type instanceKey struct {
	ep EndpointID
	id uint64
}

// Deployment joins the snapshot's records into the workers sel picks.
func (s *State) Deployment(sel Selector) Deployment {
	instances := map[instanceKey]entry{}
	channels := map[uint64]*Channel{} // kv-events channels by publisher
	sources := map[uint64][]*Source{} // kv-events sources by worker
	var cards []*ModelCard
	var metrics []entry
	for _, k := range slices.Sorted(maps.Keys(s.entries)) {
		e := s.entries[k]
		switch r := e.rec; {
		case r.Instance != nil:
			instances[instanceKey{r.Instance.Endpoint, r.Instance.ID}] = e
		case r.Model != nil:
			if r.Model.Suffix == "" && sel.matches(r.Model) {
				cards = append(cards, r.Model)
			}
		case r.Channel != nil && r.Channel.Topic == TopicKVEvents:
			channels[r.Channel.PublisherID] = r.Channel
		case r.Channel != nil && (r.Channel.Topic == TopicKVMetrics || r.Channel.Topic == TopicForwardPassMetrics):
			metrics = append(metrics, e)
		case r.Source != nil && r.Source.Topic == TopicKVEvents:
			sources[r.Source.WorkerID] = append(sources[r.Source.WorkerID], r.Source)
		}
	}
	slices.SortFunc(metrics, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.rec.Channel.Topic, b.rec.Channel.Topic), cmp.Compare(a.rec.Channel.PublisherID, b.rec.Channel.PublisherID))
	})
	var d Deployment
	seen := map[uint64]bool{}
	for _, c := range cards {
		if seen[c.InstanceID] {
			continue // one card per instance; a second endpoint is not a second worker
		}
		seen[c.InstanceID] = true
		inst, ok := instances[instanceKey{c.Endpoint, c.InstanceID}]
		if !ok {
			d.wait(c.InstanceID, fmt.Errorf("%w: %x: model card without an instance of %s", ErrIncomplete, c.InstanceID, c.Endpoint))
			continue
		}
		w, err := worker(c, inst, channels, sources[c.InstanceID], metrics)
		if err != nil {
			d.wait(c.InstanceID, err)
			continue
		}
		d.Workers = append(d.Workers, w)
	}
	slices.SortFunc(d.Workers, func(a, b Worker) int { return cmp.Compare(a.InstanceID, b.InstanceID) })
	for _, m := range metrics {
		for _, w := range d.Workers {
			if m.rec.Channel.Scope.Contains(w.Endpoint) {
				d.Metrics = append(d.Metrics, *m.rec.Channel)
				break
			}
		}
	}
	return d
}

func (d *Deployment) wait(id uint64, err error) {
	if d.Waiting == nil {
		d.Waiting = map[uint64]error{}
	}
	d.Waiting[id] = err
}

func worker(c *ModelCard, inst entry, channels map[uint64]*Channel, sources []*Source, metrics []entry) (Worker, error) {
	w := Worker{InstanceID: c.InstanceID, Endpoint: c.Endpoint, Model: c.Name, BlockSize: c.BlockSize,
		KVBlocks: c.KVBlocks, MaxRequests: c.MaxRequests, MaxBatchedTokens: c.MaxBatchedTokens, DPStart: c.DPStart,
		DPSize: c.DPSize, WorkerType: c.WorkerType, RequestPlane: inst.rec.Instance.Transport}
	for _, src := range sources {
		ch, ok := channels[src.PublisherID]
		if !ok || !src.Scope.Contains(c.Endpoint) || ch.Scope != src.Scope || src.DPRank < c.DPStart || src.DPRank-c.DPStart >= c.DPSize {
			continue
		}
		w.KVEvents = append(w.KVEvents, Publisher{ID: src.PublisherID, DPRank: src.DPRank, Transport: ch.Transport,
			Endpoints: ch.Endpoints, Recovery: src.Recovery})
	}
	slices.SortFunc(w.KVEvents, func(a, b Publisher) int {
		return cmp.Or(cmp.Compare(a.DPRank, b.DPRank), cmp.Compare(a.ID, b.ID))
	})
	if c.PublishesKVEvents {
		for r := c.DPStart; r < c.DPStart+c.DPSize; r++ {
			if !slices.ContainsFunc(w.KVEvents, func(p Publisher) bool { return p.DPRank == r }) {
				return w, fmt.Errorf("%w: %x: no kv-events publisher for dp rank %d yet", ErrIncomplete, c.InstanceID, r)
			}
		}
	}
	if inst.lease != 0 {
		for _, m := range metrics {
			if m.lease == inst.lease && m.rec.Channel.Scope.Contains(c.Endpoint) {
				w.Metrics = append(w.Metrics, *m.rec.Channel)
			}
		}
	}
	return w, nil
}

// Sink receives the deployment each time it changes. A watcher calls
// Sync from one goroutine at a time.
type Sink interface {
	Sync(ctx context.Context, d Deployment)
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(ctx context.Context, d Deployment)

// Sync calls f.
func (f SinkFunc) Sync(ctx context.Context, d Deployment) { f(ctx, d) }

// logDeployment logs a changed deployment: its size, why workers wait,
// and a warning when it mixes models (a router serves one: set
// Selector.Model).
func logDeployment(ctx context.Context, log *slog.Logger, d Deployment) {
	models := map[string]bool{}
	for _, w := range d.Workers {
		models[w.Model] = true
	}
	log.InfoContext(ctx, "dynamo: deployment changed", "workers", len(d.Workers), "load_channels", len(d.Metrics), "waiting", len(d.Waiting))
	for _, id := range slices.Sorted(maps.Keys(d.Waiting)) {
		log.InfoContext(ctx, "dynamo: worker not ready", "instance", id, "why", d.Waiting[id])
	}
	if len(models) > 1 {
		log.WarnContext(ctx, "dynamo: workers of several models selected; set Selector.Model", "models", slices.Sorted(maps.Keys(models)))
	}
}
