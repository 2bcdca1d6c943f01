package dynamo

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
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
// kv-events publishers with their ranks and, on the tcp request plane,
// their recovery endpoints. Publishers on another transport are left out.
//
// Ranks are the router's: Dynamo's rank DPStart+r is the engine's rank r
// (0 to DPSize-1), so a worker whose ranks start above 0 is routed like
// any other; the event-plane subscriber (DPStartRanks) and the request
// forwarded to Dynamo's frontend (x-dynamo-dp-rank) add DPStart back.
func (w *Worker) Engine() discovery.Engine {
	e := discovery.Engine{Name: w.Name(), ID: kvroute.WorkerID(w.InstanceID), Ready: true, Ranks: w.DPSize,
		BlockSize: w.BlockSize, KVBlocks: w.KVBlocks, MaxRequests: w.MaxRequests, MaxBatchedTokens: w.MaxBatchedTokens,
		Role: w.WorkerType}
	for _, p := range w.KVEvents {
		if p.Transport != "Zmq" {
			continue
		}
		dp := discovery.DynamoPublisher{Endpoint: p.Endpoints[0], Rank: p.DPRank - w.DPStart}
		if p.Recovery != nil && p.Recovery.Kind == "tcp" {
			dp.Recovery = p.Recovery.Address
		}
		e.DynamoEvents = append(e.DynamoEvents, dp)
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

// DPStartRanks is the ability of an event-plane subscriber to count a
// worker's data-parallel ranks from its start rank (Worker.DPStart), as
// the router models them; *kvdynamo.Subscriber and
// *kvdynamo.NATSSubscriber have it. PoolSink and NATSSink give a
// subscriber with it the deployment's start ranks before its workers are
// registered; a subscriber without it only follows workers whose ranks
// start at 0.
type DPStartRanks interface {
	// SetDPStartRanks replaces the table of start ranks by instance id
	// (workers it does not name start at 0).
	SetDPStartRanks(starts map[uint64]int) error
	// DPStartRank returns worker's start rank in the table.
	DPStartRank(worker uint64) int
}

// StartRanks returns the deployment's workers whose ranks do not start at
// 0, with their start ranks, by instance id.
func StartRanks(d Deployment) map[uint64]int {
	out := map[uint64]int{}
	for _, w := range d.Workers {
		if w.DPStart != 0 {
			out[w.InstanceID] = w.DPStart
		}
	}
	return out
}

// setStarts gives sub the deployment's start ranks when it has the
// ability, and reports whether it can follow the deployment's workers:
// those whose ranks start above 0 need the ability.
func setStarts(sub any, d Deployment) bool {
	starts := StartRanks(d)
	if sr, ok := sub.(DPStartRanks); ok {
		// The table holds what Worker records (bounded ranks): it is
		// not refused.
		_ = sr.SetDPStartRanks(starts)
		return true
	}
	return len(starts) == 0
}

// startsSetter is a Sink that gives a subscriber the deployment's start
// ranks; Sinks has each do so before any syncs, so that a subscriber
// knows a worker's ranks before another sink registers the worker.
type startsSetter interface {
	setStarts(d Deployment)
}

// KVEvents returns a discovery.PoolConfig.DynamoEvents that has sub
// follow a worker's kv-events publisher from when the Pool registers the
// worker until it removes it: the runner adds the publisher when it
// starts and removes it when its context ends, before the Pool calls
// RemoveWorker. A publisher with a recovery endpoint is followed with it,
// so that the subscriber restores the worker's cache when it first hears
// from it and fetches the events lost in a gap; its queries name the
// worker's Dynamo rank (the engine's rank plus the start rank PoolSink
// gave sub, see DPStartRanks).
//
// Workers may share an endpoint for a while (an engine restarted on the
// port of its predecessor, whose keys have not expired yet): sub follows
// it while any of their runners runs, as the newest of them describes it.
func KVEvents(sub Publishers) func(e *discovery.Engine, p discovery.DynamoPublisher) (discovery.EventRunner, error) {
	users := &endpointUsers{sub: sub, runs: map[string][]*publisherRun{}}
	return func(e *discovery.Engine, p discovery.DynamoPublisher) (discovery.EventRunner, error) {
		if p.Endpoint == "" || p.Rank < 0 || e.KVBlocks < 0 || e.BlockSize < 0 {
			return nil, fmt.Errorf("%w: kv-events publisher %q of %s", ErrConfig, p.Endpoint, e.Name)
		}
		pub := kvdynamo.Publisher{Endpoint: p.Endpoint, Topic: kvdynamo.TopicKVEvents, KVCapacityBlocks: e.KVBlocks,
			BlockSize: e.BlockSize, MaxRequests: e.MaxRequests, MaxBatchedTokens: e.MaxBatchedTokens}
		if p.Recovery != "" {
			// The worker's queries take Dynamo's rank.
			start := 0
			if sr, ok := sub.(DPStartRanks); ok {
				start = sr.DPStartRank(uint64(e.ID))
			}
			rt, err := kvdynamo.ParseRecoveryTarget(p.Recovery, uint64(e.ID), uint32(start+p.Rank))
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %w", ErrConfig, e.Name, err)
			}
			pub.Recovery = &rt
		}
		return &publisherRun{users: users, p: pub}, nil
	}
}

// endpointUsers are the runners of KVEvents that follow each endpoint,
// oldest first.
type endpointUsers struct {
	sub  Publishers
	mu   sync.Mutex
	runs map[string][]*publisherRun
}

// acquire has sub follow r's publisher, as r describes it.
func (u *endpointUsers) acquire(r *publisherRun) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if err := u.sub.AddPublisher(r.p); err != nil {
		return err
	}
	u.runs[r.p.Endpoint] = append(u.runs[r.p.Endpoint], r)
	return nil
}

// release stops following r's endpoint when no other runner follows it,
// and otherwise follows it as the newest of the others describes it.
func (u *endpointUsers) release(r *publisherRun) {
	u.mu.Lock()
	defer u.mu.Unlock()
	ep := r.p.Endpoint
	runs := slices.DeleteFunc(u.runs[ep], func(x *publisherRun) bool { return x == r })
	if len(runs) == 0 {
		delete(u.runs, ep)
		u.sub.RemovePublisher(ep)
		return
	}
	u.runs[ep] = runs
	// It was valid when its runner added it.
	_ = u.sub.AddPublisher(runs[len(runs)-1].p)
}

type publisherRun struct {
	users *endpointUsers
	p     kvdynamo.Publisher
}

// Run follows the publisher until ctx ends.
func (r *publisherRun) Run(ctx context.Context) error {
	if err := r.users.acquire(r); err != nil {
		return err
	}
	<-ctx.Done()
	r.users.release(r)
	return ctx.Err()
}

// PoolSink returns a Sink that syncs a deployment's workers to pool as
// Engines, first giving sub the workers' start ranks (see DPStartRanks;
// when sub lacks that ability, workers whose ranks start above 0 are left
// out of the pool), and, when sub is not nil, has sub follow the deployment's load
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

func (s *poolSink) setStarts(d Deployment) {
	if s.sub != nil {
		setStarts(s.sub, d)
	}
}

func (s *poolSink) Sync(ctx context.Context, d Deployment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	engines := Engines(d)
	if s.sub != nil && !setStarts(s.sub, d) {
		engines = slices.DeleteFunc(engines, func(e discovery.Engine) bool {
			i, _ := slices.BinarySearchFunc(d.Workers, uint64(e.ID), func(w Worker, id uint64) int { return cmp.Compare(w.InstanceID, id) })
			return d.Workers[i].DPStart != 0
		})
	}
	s.pool.Sync(ctx, engines)
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
	for _, w := range d.Workers {
		for _, c := range w.Metrics {
			add(c, w.limits())
		}
	}
	shared := sharedLimits(d)
	for _, c := range d.Metrics {
		if _, ok := want[c.Endpoints[0]]; !ok {
			add(c, shared)
		}
	}
	reconcile(s.load, want, s.sub.RemovePublisher, s.sub.AddPublisher)
}

// reconcile makes have hold want: it removes (with remove) the keys that
// went or whose value changed, then adds (with add) the new ones; those
// add refuses stay out, to be tried again at the next call.
func reconcile[V comparable](have, want map[string]V, remove func(string), add func(V) error) {
	for _, k := range slices.Sorted(maps.Keys(have)) {
		if v, ok := want[k]; !ok || v != have[k] {
			remove(k)
			delete(have, k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if _, ok := have[k]; !ok && add(want[k]) == nil {
			have[k] = want[k]
		}
	}
}

// limits returns a publisher description with the worker's capacity and
// limits.
func (w *Worker) limits() kvdynamo.Publisher {
	return kvdynamo.Publisher{KVCapacityBlocks: w.KVBlocks, BlockSize: w.BlockSize, MaxRequests: w.MaxRequests, MaxBatchedTokens: w.MaxBatchedTokens}
}

// sharedLimits returns the capacity and limits the deployment's workers
// share, zero where they differ.
func sharedLimits(d Deployment) kvdynamo.Publisher {
	acc := kvdynamo.Publisher{KVCapacityBlocks: -1, BlockSize: -1, MaxRequests: -1, MaxBatchedTokens: -1}
	for _, w := range d.Workers {
		l := w.limits()
		acc = kvdynamo.Publisher{KVCapacityBlocks: same(acc.KVCapacityBlocks, l.KVCapacityBlocks),
			BlockSize: same(acc.BlockSize, l.BlockSize), MaxRequests: same(acc.MaxRequests, l.MaxRequests),
			MaxBatchedTokens: same(acc.MaxBatchedTokens, l.MaxBatchedTokens)}
	}
	return kvdynamo.Publisher{KVCapacityBlocks: max(acc.KVCapacityBlocks, 0), BlockSize: max(acc.BlockSize, 0),
		MaxRequests: max(acc.MaxRequests, 0), MaxBatchedTokens: max(acc.MaxBatchedTokens, 0)}
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

// Sinks hands each deployment to every sink, in order, after the
// event-plane subscribers of its PoolSinks and NATSSinks were given the
// deployment's start ranks (see DPStartRanks), so that a subscriber knows
// a worker's ranks before another sink registers the worker.
type Sinks []Sink

// Sync calls each sink's Sync.
func (s Sinks) Sync(ctx context.Context, d Deployment) {
	for _, k := range s {
		if ss, ok := k.(startsSetter); ok {
			ss.setStarts(d)
		}
	}
	for _, k := range s {
		k.Sync(ctx, d)
	}
}

// Channels is the part of a NATS event-plane subscriber discovery drives;
// *kvdynamo.NATSSubscriber (package kvevents/dynamo) is one.
type Channels interface {
	AddChannel(ch kvdynamo.NATSChannel) error
	RemoveChannel(subject string)
}

// NATSSink returns a Sink that has sub follow a deployment's channels on
// Dynamo's NATS event plane (--event-plane nats): the subjects its
// workers' kv-events and its load topics are published on. Workers of an
// endpoint share a subject, which is followed once, with the capacity and
// limits the workers share, while any of them is in the deployment; each
// message is the worker's its payload names. Put it after PoolSink in
// Sinks, so that subjects are followed once their workers are registered
// (Sinks gives sub the workers' start ranks before PoolSink registers
// them, see DPStartRanks). A sub without DPStartRanks does not follow a
// deployment with workers whose ranks start above 0.
func NATSSink(sub Channels) Sink {
	return &natsSink{sub: sub, subjects: map[string]kvdynamo.NATSChannel{}}
}

type natsSink struct {
	sub Channels
	// mu serialises Sync and protects subjects.
	mu       sync.Mutex
	subjects map[string]kvdynamo.NATSChannel // followed channels by subject
}

func (s *natsSink) setStarts(d Deployment) { setStarts(s.sub, d) }

func (s *natsSink) Sync(_ context.Context, d Deployment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := map[string]kvdynamo.NATSChannel{}
	if setStarts(s.sub, d) {
		for _, ch := range NATSChannels(d) {
			want[ch.Subject] = ch
		}
	}
	reconcile(s.subjects, want, s.sub.RemoveChannel, s.sub.AddChannel)
}

// NATSChannels returns the channels a deployment publishes on Dynamo's
// NATS event plane, sorted by subject: its workers' kv-events subjects and
// its load subjects, each once, with the capacity and limits the workers
// share.
func NATSChannels(d Deployment) []kvdynamo.NATSChannel {
	l := sharedLimits(d)
	want := map[string]kvdynamo.NATSChannel{}
	add := func(transport, prefix, topic string) {
		if transport == "Nats" {
			subj := prefix + "." + encodeSegment(topic)
			want[subj] = kvdynamo.NATSChannel{Subject: subj, KVCapacityBlocks: l.KVCapacityBlocks, BlockSize: l.BlockSize,
				MaxRequests: l.MaxRequests, MaxBatchedTokens: l.MaxBatchedTokens}
		}
	}
	for _, w := range d.Workers {
		for _, p := range w.KVEvents {
			add(p.Transport, p.Endpoints[0], TopicKVEvents)
		}
	}
	for _, c := range d.Metrics {
		add(c.Transport, c.Endpoints[0], c.Topic)
	}
	out := make([]kvdynamo.NATSChannel, 0, len(want))
	for _, k := range slices.Sorted(maps.Keys(want)) {
		out = append(out, want[k])
	}
	return out
}

// encodeSegment escapes a subject token as Dynamo does: letters, digits,
// '-' and '_' are kept, every other byte becomes %XX.
func encodeSegment(s string) string {
	var b strings.Builder
	for i := range len(s) {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
