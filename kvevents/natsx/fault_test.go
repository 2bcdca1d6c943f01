package natsx_test

import (
	"container/list"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/loopback"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/natsx"
	"github.com/kvroute/kvroute/router"
)

// natsServer is an embedded NATS server that can be restarted on its port.
type natsServer struct {
	t    testing.TB
	addr string
	srv  *server.Server
}

func startNATSServer(t testing.TB) *natsServer {
	t.Helper()
	// A port below the ephemeral range: no process binding port 0 can
	// take it while the server is down between restarts.
	port, err := loopback.FreePort()
	require.NoError(t, err)
	s := &natsServer{t: t, addr: "127.0.0.1:" + strconv.Itoa(port)}
	s.start()
	t.Cleanup(func() { s.srv.Shutdown() })
	return s
}

func (s *natsServer) start() {
	_, port, _ := net.SplitHostPort(s.addr)
	p, _ := strconv.Atoi(port)
	var err error
	for range 100 { // the port may linger for a moment after a shutdown
		s.srv, err = server.NewServer(&server.Options{Host: "127.0.0.1", Port: p, NoLog: true, NoSigs: true})
		require.NoError(s.t, err)
		go s.srv.Start()
		if s.srv.ReadyForConnections(5 * time.Second) {
			return
		}
		s.srv.Shutdown()
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatal("nats server did not restart")
}

func (s *natsServer) restart(down time.Duration) {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	time.Sleep(down)
	s.start()
}

// simEngine is a simulated inference engine: a prefix cache of capacity
// blocks with LRU eviction that reports what it stores and evicts as vLLM
// KV-event batches, numbered from 0 like vLLM's publisher.
type simEngine struct {
	mu       sync.Mutex
	id       kvroute.WorkerID
	capacity int
	lru      *list.List // of kvroute.SeqHash, most recent first
	cache    map[kvroute.SeqHash]*list.Element
	seq      uint64 // next batch sequence number
	out      chan<- engineBatch
}

// engineBatch is one encoded batch on its way to the relay.
type engineBatch struct {
	engine  kvroute.WorkerID
	seq     uint64
	payload []byte
}

func extOf(s kvroute.SeqHash) uint64 { return uint64(s) ^ 0x5eed }

func newSimEngine(id kvroute.WorkerID, capacity int, out chan<- engineBatch) *simEngine {
	return &simEngine{id: id, capacity: capacity, lru: list.New(), cache: map[kvroute.SeqHash]*list.Element{}, out: out}
}

// serve runs a prompt through the cache and publishes the batch of what
// changed.
func (e *simEngine) serve(tokens []uint32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	seqs := hasher.AppendSeqHashes(nil, tokens)
	var evs []kvevents.EngineEvent
	var run *kvevents.EngineEvent
	for i, s := range seqs {
		if el, ok := e.cache[s]; ok {
			e.lru.MoveToFront(el)
			run = nil
			continue
		}
		for len(e.cache) >= e.capacity {
			back := e.lru.Back()
			old := back.Value.(kvroute.SeqHash)
			e.lru.Remove(back)
			delete(e.cache, old)
			evs = append(evs, kvevents.EngineEvent{Type: kvevents.BlockRemoved,
				BlockHashes: []kvevents.Hash{kvevents.UintHash(extOf(old))}})
			run = nil
		}
		e.cache[s] = e.lru.PushFront(s)
		if run == nil {
			ev := kvevents.EngineEvent{Type: kvevents.BlockStored, BlockSize: bs}
			if i > 0 {
				ev.ParentBlockHash = kvevents.UintHash(extOf(seqs[i-1]))
			}
			evs = append(evs, ev)
			run = &evs[len(evs)-1]
		}
		run.BlockHashes = append(run.BlockHashes, kvevents.UintHash(extOf(s)))
		run.TokenIDs = append(run.TokenIDs, tokens[i*bs:(i+1)*bs]...)
	}
	if len(evs) == 0 {
		return
	}
	payload, err := kvevents.AppendBatch(nil, &kvevents.Batch{Timestamp: 1, Events: evs, RankSlot: true})
	if err != nil {
		panic(err)
	}
	e.out <- engineBatch{engine: e.id, seq: e.seq, payload: payload}
	e.seq++
}

// restart empties the cache; the next batch is numbered 0 again.
func (e *simEngine) restart() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lru.Init()
	clear(e.cache)
	e.seq = 0
}

// reference returns the sorted sequence hashes the engine caches.
func (e *simEngine) reference() []kvroute.SeqHash {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]kvroute.SeqHash, 0, len(e.cache))
	for s := range e.cache {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// relay decodes the engines' batches and hands their events to the
// Publisher, as a kvevents/zmq Subscriber would: a batch sequence that
// goes back means the engine restarted, and its worker is reset.
func relay(ctx context.Context, in <-chan engineBatch, pub *natsx.Publisher) error {
	convs := map[kvroute.WorkerID]*kvevents.Converter{}
	last := map[kvroute.WorkerID]uint64{}
	var b kvevents.Batch
	var evs []kvroute.Event
	for {
		var eb engineBatch
		select {
		case <-ctx.Done():
			return nil
		case eb = <-in:
		}
		conv := convs[eb.engine]
		if conv == nil {
			var err error
			if conv, err = kvevents.NewConverter(kvevents.ConverterConfig{Worker: eb.engine, BlockSize: bs}); err != nil {
				return err
			}
			convs[eb.engine] = conv
		} else if eb.seq <= last[eb.engine] {
			pub.ResetWorker(kvroute.WorkerKey{ID: eb.engine})
		}
		last[eb.engine] = eb.seq
		if err := kvevents.DecodeBatch(eb.payload, &b); err != nil {
			return err
		}
		var err error
		if evs, err = conv.Convert(evs[:0], &b); err != nil {
			return err
		}
		for i := range evs {
			_ = pub.Apply(&evs[i]) // a failed publish stays in the replay buffer
		}
	}
}

// faultCluster is the system under test: replicas behind lossy proxies,
// a relay behind its own, engines and the clients' traffic.
type faultCluster struct {
	t       *testing.T
	nats    *natsServer
	cfg     nodeConfig
	proxies []*natsProxy // one per replica, then the relay's
	nodes   []*node
	engines []*simEngine
	workers []kvroute.WorkerID
	gate    sync.RWMutex // clients hold it for reading per request; pause takes it
	paused  bool         // the test goroutine holds gate
	served  atomic.Uint64
	gone    []natsx.ReplicaStats // stats of stopped replicas
}

func (c *faultCluster) startNode(i int) *node {
	return startNode(c.t, c.proxies[i].URL(), "replica-"+strconv.Itoa(i), c.cfg, c.workers...)
}

// prompt is a request of the shared-prefix workload: one of 16 system
// prompts of 6 blocks, then 2 blocks unique to the request.
func prompt(rng *rand.Rand) []uint32 {
	sys := rng.IntN(16)
	out := make([]uint32, 0, 8*bs)
	for j := range 6 * bs {
		out = append(out, uint32(sys*1000+j))
	}
	for range 2 * bs {
		out = append(out, rng.Uint32())
	}
	return out
}

// client sends requests through replica i until ctx ends: route, serve
// on the chosen engine (which publishes its cache changes), first token,
// output, done.
func (c *faultCluster) client(ctx context.Context, i int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(i)))
	for ctx.Err() == nil {
		tokens := prompt(rng)
		c.gate.RLock()
		d, err := c.nodes[i].rt.Select(ctx, &router.Request{Tokens: tokens, ExpectedOutputTokens: 16})
		if err != nil {
			c.gate.RUnlock()
			time.Sleep(5 * time.Millisecond)
			continue
		}
		c.engines[d.Worker.ID-1].serve(tokens)
		d.PrefillDone()
		d.AddOutputTokens(16)
		time.Sleep(time.Millisecond)
		d.Done(router.Outcome{})
		c.gate.RUnlock()
		c.served.Add(1)
		time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
	}
}

// pause waits for the requests in flight and stops new ones.
func (c *faultCluster) pause() { c.gate.Lock(); c.paused = true }

func (c *faultCluster) resume() { c.paused = false; c.gate.Unlock() }

// converged reports whether every replica's index equals every engine's
// cache and no tracker holds a request; it returns what differs.
func (c *faultCluster) converged() (bool, string) {
	for _, e := range c.engines {
		ref := e.reference()
		for _, n := range c.nodes {
			if got := n.blocks(kvroute.WorkerKey{ID: e.id}); !slices.Equal(got, ref) {
				return false, fmt.Sprintf("%s: worker %d holds %d blocks, engine %d", n.id, e.id, len(got), len(ref))
			}
		}
	}
	for _, n := range c.nodes {
		if l := n.tracker.Len(); l != 0 {
			return false, fmt.Sprintf("%s: %d requests tracked", n.id, l)
		}
	}
	return true, ""
}

// converge pauses the traffic, waits until converged and returns the
// time it took.
func (c *faultCluster) converge(what string) time.Duration {
	c.t.Helper()
	start := time.Now()
	deadline := start.Add(45 * time.Second)
	for {
		ok, why := c.converged()
		if ok {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not converged: %s", what, why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stats sums the replicas' counters, the stopped ones' included.
func (c *faultCluster) stats() natsx.ReplicaStats {
	var sum natsx.ReplicaStats
	all := append([]natsx.ReplicaStats(nil), c.gone...)
	for _, n := range c.nodes {
		all = append(all, n.rep.Stats())
	}
	for _, s := range all {
		sum.Applied += s.Applied
		sum.Gaps += s.Gaps
		sum.ByDump += s.ByDump
		sum.ByReplay += s.ByReplay
		sum.Resets += s.Resets
		sum.PeerResyncs += s.PeerResyncs
		sum.PeerDrops += s.PeerDrops
		sum.LoadOps += s.LoadOps
	}
	return sum
}

// lossy drops event and load messages with probability p, from the
// server to a replica (toClient) or from a client to the server.
func lossy(seed uint64, p float64) dropFunc {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 1))
	return func(subject string, _ []byte, _ bool) bool {
		if subject != natsx.DefaultPrefix+".events" && subject != natsx.DefaultPrefix+".load" {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		return rng.Float64() < p
	}
}

// TestFaults runs 3 router replicas over an embedded NATS server, fed by
// a relay of 8 simulated engines, with steady traffic through every
// replica, through a replica restart, a NATS server restart, message
// loss, an engine restart, a worker removed and added again while its
// engine kept its cache (the routers' RemoveGrace keeps its blocks), and
// a worker replaced by an empty engine (PurgeWorker). After each fault
// every replica's index must equal the engines' caches and no
// request may be left in any tracker; no worker may have been reset, since
// a peer or the relay could always repair it.
func TestFaults(t *testing.T) {
	const replicas, engines = 3, 8
	c := &faultCluster{t: t, nats: startNATSServer(t),
		cfg: nodeConfig{ttl: time.Minute, heartbeat: 50 * time.Millisecond, peerTimeout: 2 * time.Second, syncTimeout: 3 * time.Second,
			removeGrace: time.Minute}}
	for range replicas + 1 {
		c.proxies = append(c.proxies, startProxy(t, c.nats.addr))
	}
	batches := make(chan engineBatch, 4096)
	for i := range engines {
		c.workers = append(c.workers, kvroute.WorkerID(i+1))
		c.engines = append(c.engines, newSimEngine(kvroute.WorkerID(i+1), 48, batches))
	}
	for i := range replicas {
		c.nodes = append(c.nodes, c.startNode(i))
	}
	pub, _ := startRelay(t, connect(t, c.proxies[replicas].URL()), 0)
	relayCtx, stopRelay := context.WithCancel(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	var relayWG, wg sync.WaitGroup
	defer func() {
		cancel()
		if c.paused { // a step failed while the traffic was paused
			c.resume()
		}
		wg.Wait()
		stopRelay()
		relayWG.Wait()
	}()
	relayWG.Go(func() { require.NoError(t, relay(relayCtx, batches, pub)) })
	for i := range replicas {
		for k := range 2 {
			wg.Go(func() { c.client(ctx, i, uint64(10*k+1)) })
		}
	}
	run := func(d time.Duration) { time.Sleep(d) }
	type figure struct {
		fault string
		took  time.Duration
	}
	var figures []figure
	step := func(fault string, inject func()) {
		inject()
		c.pause()
		took := c.converge(fault)
		c.resume()
		figures = append(figures, figure{fault, took})
	}

	step("steady traffic", func() { run(time.Second) })
	step("replica restart", func() {
		c.pause()
		// A request in flight on the replica that dies: its peers must
		// drop it.
		_, err := c.nodes[1].rt.Select(ctx, &router.Request{Tokens: prompt(rand.New(rand.NewPCG(1, 2)))})
		require.NoError(t, err)
		c.gone = append(c.gone, c.nodes[1].rep.Stats())
		c.nodes[1].stop()
		c.nodes[1] = c.startNode(1)
		// The new replica's index is its peer's dump: before any traffic
		// can repair a block it got wrong, it must equal the engines'.
		c.converge("replica restart, from the dump alone")
		c.resume()
		run(time.Second)
	})
	step("NATS server restart", func() {
		run(200 * time.Millisecond)
		c.nats.restart(300 * time.Millisecond)
		run(time.Second)
	})
	step("message loss", func() {
		for i, p := range c.proxies {
			share := 0.05 // lost on the way to one replica: a peer has it
			if i == replicas {
				share = 0.03 // lost on the way from the relay: no replica has it
			}
			p.setDrop(lossy(uint64(i), share))
		}
		run(2 * time.Second)
		for _, p := range c.proxies {
			p.setDrop(nil)
		}
	})
	step("engine restart", func() {
		c.engines[2].restart()
		run(time.Second)
	})
	step("worker re-added, engine kept its cache", func() {
		c.pause()
		c.converge("before the removal")
		e := c.engines[5]
		for _, n := range c.nodes {
			require.True(t, n.rt.RemoveWorker(e.id))
		}
		// Its requests in flight finish meanwhile: the engine stores and
		// evicts a few blocks (not so many that its whole cache is
		// announced again) while no router routes to it.
		rng := rand.New(rand.NewPCG(5, 6))
		for range 3 {
			e.serve(prompt(rng))
		}
		for _, n := range c.nodes {
			require.NoError(t, n.rt.AddWorker(router.StaticWorker{WorkerID: e.id, Block: bs}))
		}
		// Before any new traffic: every index holds the engine's cache.
		c.converge("re-added, before traffic")
		c.resume()
		run(time.Second)
	})
	step("worker purged, engine replaced", func() {
		c.pause()
		c.converge("before the removal")
		w := c.engines[4].id
		for _, n := range c.nodes {
			require.True(t, n.rt.PurgeWorker(w))
		}
		c.engines[4].restart() // the engine that comes back starts empty
		for _, n := range c.nodes {
			require.NoError(t, n.rt.AddWorker(router.StaticWorker{WorkerID: w, Block: bs}))
		}
		c.converge("purged, before traffic")
		c.resume()
		run(time.Second)
	})

	cancel()
	wg.Wait()
	took := c.converge("the end")
	figures = append(figures, figure{"end of traffic", took})
	st := c.stats()
	dropped := uint64(0)
	for _, p := range c.proxies {
		dropped += p.dropped.Load()
	}
	t.Logf("requests served: %d", c.served.Load())
	t.Logf("events applied (all replicas): %d, messages dropped: %d", st.Applied, dropped)
	t.Logf("gaps: %d, repaired by dump: %d, by replay: %d, by reset: %d", st.Gaps, st.ByDump, st.ByReplay, st.Resets)
	t.Logf("load: %d peer operations applied, %d peer resyncs, %d peers dropped", st.LoadOps, st.PeerResyncs, st.PeerDrops)
	for _, f := range figures {
		t.Logf("converged after %-40s in %v", f.fault+":", f.took.Round(time.Millisecond))
	}
	require.Positive(t, st.Gaps)
	require.Positive(t, st.ByDump+st.ByReplay)
	require.Zero(t, st.Resets, "a worker was reset although a peer or the relay could repair it")
	require.Positive(t, st.PeerDrops, "the restarted replica's lost request was dropped")
}
