package discovery_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/epp"
	"github.com/kvroute/kvroute/internal/fakeengine"
	"github.com/kvroute/kvroute/kvevents/zmq"
	"github.com/kvroute/kvroute/router"
)

// describe returns the discovery view of a fake engine.
func describe(t *testing.T, name string, e *fakeengine.Engine, ready bool) discovery.Engine {
	host, port, err := net.SplitHostPort(e.Addr())
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	return discovery.Engine{Name: name, Host: host, Ports: []int{p}, Ready: ready, Events: e.Events(), Replay: e.Replay(),
		Topic: fakeengine.Topic, Metrics: e.URL() + "/metrics", Kind: "vllm"}
}

func TestPoolSync(t *testing.T) {
	ctx := context.Background()
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	require.NoError(t, err)
	eps := &epp.Endpoints{}
	scraper, err := enginemetrics.New(enginemetrics.Config{Router: r, Interval: 10 * time.Millisecond})
	require.NoError(t, err)
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, Addresses: eps, Scraper: scraper,
		Subscriber: zmq.Config{IdleTimeout: 200 * time.Millisecond}})
	require.NoError(t, err)
	defer pool.Close()

	var engines []*fakeengine.Engine
	for i, bs := range []int{16, 16, 32} {
		e, err := fakeengine.Start(fakeengine.Config{ID: kvroute.WorkerID(i + 1), BlockSize: bs})
		require.NoError(t, err)
		defer e.Close()
		engines = append(engines, e)
	}
	a, b, wrong := describe(t, "ns/a", engines[0], true), describe(t, "ns/b", engines[1], true), describe(t, "ns/wrong", engines[2], true)
	idA, idB := discovery.WorkerIDOf("ns/a"), discovery.WorkerIDOf("ns/b")

	pool.Sync(ctx, []discovery.Engine{a, b, wrong, {Name: "ns/bad", Host: "x", Ready: true}})
	require.ElementsMatch(t, []kvroute.WorkerKey{{ID: idA}, {ID: idB}}, r.Workers())
	addr, ok := eps.Address(kvroute.WorkerKey{ID: idA})
	require.True(t, ok)
	require.Equal(t, engines[0].Addr(), addr)
	rej := pool.Rejected()
	require.ErrorIs(t, rej["ns/wrong"], enginemetrics.ErrBlockSize)
	require.ErrorIs(t, rej["ns/bad"], discovery.ErrEngine)
	// The scraper reports the engines' load.
	require.Eventually(t, func() bool {
		n := 0
		for _, w := range r.Stats().Workers {
			if w.Reported.KVCapacityBlocks == 1024 {
				n++
			}
		}
		return n == 2
	}, 5*time.Second, 5*time.Millisecond)

	// b stops being ready; a moves to another port.
	b.Ready = false
	moved := a
	moved.Ports = describe(t, "x", engines[1], true).Ports
	pool.Sync(ctx, []discovery.Engine{moved, b})
	require.Equal(t, []kvroute.WorkerKey{{ID: idA}}, r.Workers())
	addr, _ = eps.Address(kvroute.WorkerKey{ID: idA})
	require.Equal(t, engines[1].Addr(), addr)
	_, ok = eps.Address(kvroute.WorkerKey{ID: idB})
	require.False(t, ok)
	require.Len(t, pool.Members(), 1)

	require.NoError(t, pool.Close())
	require.Empty(t, r.Workers())
	require.Zero(t, eps.Len())
}

func TestParseEngine(t *testing.T) {
	e, err := discovery.ParseEngine("vllm-0=10.0.0.7:8000,ports=8000+8001,events=tcp://10.0.0.7:5557,replay=tcp://10.0.0.7:5600,topic=kv,metrics=http://10.0.0.7:8000/metrics,kind=vllm,id=9")
	require.NoError(t, err)
	require.Equal(t, discovery.Engine{Name: "vllm-0", ID: 9, Host: "10.0.0.7", Ports: []int{8000, 8001}, Ready: true,
		Events: "tcp://10.0.0.7:5557", Replay: "tcp://10.0.0.7:5600", Topic: "kv", Metrics: "http://10.0.0.7:8000/metrics", Kind: "vllm"}, e)
	for _, bad := range []string{"x", "a=host", "a=h:p", "a=h:1,zz=1", "a=h:1,ports=1+x", "a=h:1,kind=tgi", "a=h:1,replay=tcp://h:2", "a=h:1,id=-1"} {
		_, err := discovery.ParseEngine(bad)
		require.ErrorIs(t, err, discovery.ErrEngine, bad)
	}
}

func TestPoolRetriesRejected(t *testing.T) {
	e, err := fakeengine.Start(fakeengine.Config{ID: 1})
	require.NoError(t, err)
	defer e.Close()
	var up atomic.Bool
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		resp, err := http.Get(e.URL() + "/metrics")
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		_, _ = io.Copy(w, resp.Body)
	}))
	defer metrics.Close()
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	scraper, err := enginemetrics.New(enginemetrics.Config{Router: r})
	require.NoError(t, err)
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, Scraper: scraper, RetryInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	defer pool.Close()
	eng := describe(t, "ns/late", e, true)
	eng.Metrics = metrics.URL + "/metrics"
	pool.Sync(context.Background(), []discovery.Engine{eng})
	require.ErrorIs(t, pool.Rejected()["ns/late"], enginemetrics.ErrScrape)
	require.Empty(t, r.Workers())
	up.Store(true)
	require.Eventually(t, func() bool { return len(r.Workers()) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Empty(t, pool.Rejected())
}

func TestPoolAdmit(t *testing.T) {
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	errNo := errors.New("not admitted")
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, RetryInterval: -1,
		Admit: func(_ context.Context, e *discovery.Engine) error {
			if e.Name == "no" {
				return errNo
			}
			return nil
		}})
	require.NoError(t, err)
	defer pool.Close()
	pool.Sync(context.Background(), []discovery.Engine{
		{Name: "yes", Host: "127.0.0.1", Ports: []int{1}, Ready: true},
		{Name: "no", Host: "127.0.0.1", Ports: []int{2}, Ready: true},
	})
	require.Equal(t, []kvroute.WorkerKey{{ID: discovery.WorkerIDOf("yes")}}, r.Workers())
	require.ErrorIs(t, pool.Rejected()["no"], errNo)
}

func TestEngineWithoutPorts(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    discovery.Engine
		ok   bool
	}{
		{"ranks", discovery.Engine{Name: "d", Ranks: 2, Ready: true}, true},
		{"dynamo events", discovery.Engine{Name: "d", Ranks: 2, Role: "decode", DynamoEvents: []discovery.DynamoPublisher{
			{Endpoint: "tcp://127.0.0.1:1"}, {Endpoint: "tcp://127.0.0.1:2", Rank: 1, Recovery: "127.0.0.1:3/x"}}}, true},
		{"no ranks", discovery.Engine{Name: "d"}, false},
		{"too many ranks", discovery.Engine{Name: "d", Ranks: router.MaxDataParallelRanks + 1}, false},
		{"vllm events need ports", discovery.Engine{Name: "d", Ranks: 1, Events: "tcp://h:1"}, false},
		{"ranks differ from ports", discovery.Engine{Name: "d", Host: "h", Ports: []int{1}, Ranks: 2}, false},
		{"negative capacity", discovery.Engine{Name: "d", Ranks: 1, KVBlocks: -1}, false},
		{"unknown role", discovery.Engine{Name: "d", Ranks: 1, Role: "judge"}, false},
		{"empty dynamo endpoint", discovery.Engine{Name: "d", Ranks: 1, DynamoEvents: []discovery.DynamoPublisher{{}}}, false},
		{"dynamo publisher of no rank", discovery.Engine{Name: "d", Ranks: 1, DynamoEvents: []discovery.DynamoPublisher{{Endpoint: "tcp://h:1", Rank: 1}}}, false},
	} {
		err := tc.e.Validate()
		if tc.ok {
			require.NoError(t, err, tc.name)
		} else {
			require.ErrorIs(t, err, discovery.ErrEngine, tc.name)
		}
	}
}

// An engine without ports registers with its ranks, role and capacity and
// gets no address; one whose block size differs from the router's, or
// that lists Dynamo event endpoints without a subscriber, is left out.
func TestPoolEngineWithoutPorts(t *testing.T) {
	r, err := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
	require.NoError(t, err)
	eps := &epp.Endpoints{}
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, Addresses: eps, RetryInterval: -1})
	require.NoError(t, err)
	defer pool.Close()
	pool.Sync(context.Background(), []discovery.Engine{
		{Name: "p", ID: 7, Ranks: 2, Ready: true, BlockSize: 16, KVBlocks: 800, MaxRequests: 4, MaxBatchedTokens: 512, Role: "prefill"},
		{Name: "b32", ID: 8, Ranks: 1, Ready: true, BlockSize: 32},
		{Name: "ev", ID: 9, Ranks: 1, Ready: true, DynamoEvents: []discovery.DynamoPublisher{{Endpoint: "tcp://127.0.0.1:1"}}},
	})
	require.Equal(t, []kvroute.WorkerKey{{ID: 7}, {ID: 7, Rank: 1}}, r.Workers())
	require.Zero(t, eps.Len())
	var bs *enginemetrics.BlockSizeError
	require.ErrorAs(t, pool.Rejected()["b32"], &bs)
	require.Equal(t, enginemetrics.BlockSizeError{Worker: 8, Engine: 32, Router: 16}, *bs)
	require.ErrorIs(t, pool.Rejected()["ev"], discovery.ErrEngine)
	st := r.Stats()
	require.Len(t, st.Workers, 2)
	for _, w := range st.Workers {
		require.Equal(t, router.RolePrefill, w.Role)
	}
}

// The retries of rejected engines never put back an older list than the
// source's last Sync.
func TestPoolRetryKeepsTheLastSync(t *testing.T) {
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, RetryInterval: time.Microsecond,
		Admit: func(_ context.Context, e *discovery.Engine) error {
			if e.Name == "bad" {
				return errors.New("not yet")
			}
			return nil
		}})
	require.NoError(t, err)
	defer pool.Close()
	bad := discovery.Engine{Name: "bad", Host: "127.0.0.1", Ports: []int{1}, Ready: true}
	var last string
	for i := range 2000 {
		last = "e" + strconv.Itoa(i)
		pool.Sync(context.Background(), []discovery.Engine{bad, {Name: last, Host: "127.0.0.1", Ports: []int{2}, Ready: true}})
	}
	time.Sleep(50 * time.Millisecond) // retries
	members := pool.Members()
	require.Len(t, members, 1)
	require.Equal(t, last, members[0].Name)
}

// The pool keeps its own copy of an engine: a host that reuses its list
// and changes a port in place has the change seen at the next Sync.
func TestPoolCopiesEngines(t *testing.T) {
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	eps := &epp.Endpoints{}
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, Addresses: eps, RetryInterval: -1})
	require.NoError(t, err)
	defer pool.Close()
	engines := []discovery.Engine{{Name: "a", Host: "10.0.0.1", Ports: []int{8000}, Ready: true}}
	pool.Sync(context.Background(), engines)
	engines[0].Ports[0] = 9000
	pool.Sync(context.Background(), engines)
	addr, ok := eps.Address(kvroute.WorkerKey{ID: discovery.WorkerIDOf("a")})
	require.True(t, ok)
	require.Equal(t, "10.0.0.1:9000", addr)
	members := pool.Members()
	members[0].Ports[0] = 1
	require.Equal(t, []int{9000}, pool.Members()[0].Ports, "Members returns copies")
}

// Event endpoints are checked for every rank, the first included.
func TestEngineEndpointsChecked(t *testing.T) {
	for _, ep := range []string{"garbage", "tcp://", "tcp://h", "tcp://h:99999", "tcp://:5557", "http://h:5557", "ipc://"} {
		for _, ports := range [][]int{{8000}, {8000, 8001}} {
			e := discovery.Engine{Name: "a", Host: "h", Ports: ports, Ready: true, Events: ep}
			require.ErrorIs(t, e.Validate(), discovery.ErrEngine, "events %q, %d ranks", ep, len(ports))
			e.Events, e.Replay = "tcp://h:5557", ep
			require.ErrorIs(t, e.Validate(), discovery.ErrEngine, "replay %q, %d ranks", ep, len(ports))
		}
	}
	for _, ep := range []string{"tcp://h:5557", "tcp://10.0.0.1:1", "tcp://[::1]:5557", "ipc:///tmp/kv.sock"} {
		e := discovery.Engine{Name: "a", Host: "h", Ports: []int{8000}, Ready: true, Events: ep}
		require.NoError(t, e.Validate(), ep)
	}
}
