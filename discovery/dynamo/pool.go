package dynamo

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	kvdynamo "github.com/kvroute/kvroute/kvevents/dynamo"
)

// Name returns the worker's name in a discovery.Pool:
// "namespace/component/endpoint/<instance id in hex>", its key in the
// instances bucket.
func (w *Worker) Name() string { return fmt.Sprintf("%s/%x", w.Endpoint, w.InstanceID) }

// Engine returns the worker as a discovery.Engine: ID is the instance id,
// it has no host or ports (requests go through Dynamo's frontend with the
// x-dynamo-worker-instance-id header) and DynamoEvents lists its ZMQ
// kv-events endpoints. Publishers on another transport are left out.
func (w *Worker) Engine() discovery.Engine {
	e := discovery.Engine{Name: w.Name(), ID: kvroute.WorkerID(w.InstanceID), Ready: true, Ranks: w.DPSize,
		BlockSize: w.BlockSize, KVBlocks: w.KVBlocks, MaxRequests: w.MaxRequests, MaxBatchedTokens: w.MaxBatchedTokens,
		Role: w.WorkerType}
	for _, p := range w.KVEvents {
		if p.Transport == "Zmq" && !slices.Contains(e.DynamoEvents, p.Endpoints[0]) {
			e.DynamoEvents = append(e.DynamoEvents, p.Endpoints[0])
		}
	}
	return e
}

// Engines returns the deployment's workers as discovery engines.
func Engines(d Deployment) []discovery.Engine {
	out := make([]discovery.Engine, len(d.Workers))
	for i := range d.Workers {
		out[i] = d.Workers[i].Engine()
	}
	return out
}

// Publishers is the part of an event-plane subscriber discovery drives;
// *kvdynamo.Subscriber (package kvevents/dynamo) is one.
type Publishers interface {
	AddPublisher(p kvdynamo.Publisher) error
	RemovePublisher(endpoint string)
}

// KVEvents returns a discovery.PoolConfig.DynamoEvents that has sub
// follow a worker's kv-events publisher from when the Pool registers the
// worker until it removes it: the runner adds the publisher when it
// starts and removes it when its context ends, before the Pool calls
// RemoveWorker.
func KVEvents(sub Publishers) func(e *discovery.Engine, endpoint string) (discovery.EventRunner, error) {
	return func(e *discovery.Engine, endpoint string) (discovery.EventRunner, error) {
		if endpoint == "" || e.KVBlocks < 0 || e.BlockSize < 0 {
			return nil, fmt.Errorf("%w: kv-events publisher %q of %s", ErrConfig, endpoint, e.Name)
		}
		return &publisherRun{sub: sub, p: kvdynamo.Publisher{Endpoint: endpoint, Topic: kvdynamo.TopicKVEvents,
			KVCapacityBlocks: e.KVBlocks, BlockSize: e.BlockSize, MaxRequests: e.MaxRequests, MaxBatchedTokens: e.MaxBatchedTokens}}, nil
	}
}

type publisherRun struct {
	sub Publishers
	p   kvdynamo.Publisher
}

// Run follows the publisher until ctx ends.
func (r *publisherRun) Run(ctx context.Context) error {
	if err := r.sub.AddPublisher(r.p); err != nil {
		return err
	}
	<-ctx.Done()
	r.sub.RemovePublisher(r.p.Endpoint)
	return ctx.Err()
}

// PoolSink returns a Sink that syncs a deployment's workers to pool as
// Engines and, when sub is not nil, has sub follow the deployment's load
// channels (Deployment.Metrics on ZMQ), adding those that appear after the
// pool added their workers and removing those that go. Each load channel
// is given the KV capacity, block size and batch limits of its worker
// when the store names it (etcd), or those all the workers share (zero
// where they differ). Use KVEvents(sub) as
// the pool's DynamoEvents for the workers' kv-events.
func PoolSink(pool discovery.Sink, sub Publishers) Sink {
	return &poolSink{pool: pool, sub: sub, load: map[string]kvdynamo.Publisher{}}
}

type poolSink struct {
	pool discovery.Sink
	sub  Publishers
	// mu serialises Sync and protects load.
	mu   sync.Mutex
	load map[string]kvdynamo.Publisher // followed load channels by endpoint
}

func (s *poolSink) Sync(ctx context.Context, d Deployment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pool.Sync(ctx, Engines(d))
	if s.sub == nil {
		return
	}
	want := map[string]kvdynamo.Publisher{}
	add := func(c Channel, l kvdynamo.Publisher) {
		if c.Transport == "Zmq" {
			l.Endpoint, l.Topic = c.Endpoints[0], c.Topic
			want[l.Endpoint] = l
		}
	}
	shared := kvdynamo.Publisher{KVCapacityBlocks: -1, BlockSize: -1, MaxRequests: -1, MaxBatchedTokens: -1}
	for _, w := range d.Workers {
		l := kvdynamo.Publisher{KVCapacityBlocks: w.KVBlocks, BlockSize: w.BlockSize, MaxRequests: w.MaxRequests, MaxBatchedTokens: w.MaxBatchedTokens}
		for _, c := range w.Metrics {
			add(c, l)
		}
		shared = kvdynamo.Publisher{KVCapacityBlocks: same(shared.KVCapacityBlocks, l.KVCapacityBlocks),
			BlockSize: same(shared.BlockSize, l.BlockSize), MaxRequests: same(shared.MaxRequests, l.MaxRequests),
			MaxBatchedTokens: same(shared.MaxBatchedTokens, l.MaxBatchedTokens)}
	}
	for _, c := range d.Metrics {
		if _, ok := want[c.Endpoints[0]]; !ok {
			add(c, kvdynamo.Publisher{KVCapacityBlocks: max(shared.KVCapacityBlocks, 0), BlockSize: max(shared.BlockSize, 0),
				MaxRequests: max(shared.MaxRequests, 0), MaxBatchedTokens: max(shared.MaxBatchedTokens, 0)})
		}
	}
	for _, ep := range slices.Sorted(maps.Keys(s.load)) {
		if p, ok := want[ep]; !ok || p != s.load[ep] {
			s.sub.RemovePublisher(ep)
			delete(s.load, ep)
		}
	}
	for _, ep := range slices.Sorted(maps.Keys(want)) {
		if _, ok := s.load[ep]; ok {
			continue
		}
		if err := s.sub.AddPublisher(want[ep]); err == nil {
			s.load[ep] = want[ep]
		}
	}
}

// same folds v into acc: -1 is "nothing yet", 0 "they differ".
func same(acc, v int) int {
	switch acc {
	case -1:
		return v
	case v:
		return acc
	}
	return 0
}
