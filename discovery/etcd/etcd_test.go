package etcd_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/etcd"
	"github.com/kvroute/kvroute/epp"
	"github.com/kvroute/kvroute/internal/etcdtest"
	"github.com/kvroute/kvroute/router"
)

// startEtcd runs a one-member etcd on loopback for the test.
func startEtcd(t *testing.T) *clientv3.Client {
	c, _ := etcdtest.Start(t)
	return c
}

// recorder is a Sink that keeps the last set.
type recorder struct {
	mu   sync.Mutex
	last []string
	n    int
}

func (r *recorder) Sync(_ context.Context, engines []discovery.Engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	r.last = r.last[:0]
	for _, e := range engines {
		r.last = append(r.last, e.Name)
	}
}

func (r *recorder) names() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.last, ",")
}

func engine(name string, port int) discovery.Engine {
	return discovery.Engine{Name: name, Host: "127.0.0.1", Ports: []int{port}, Ready: true}
}

func TestWatchRegisterAndLeases(t *testing.T) {
	c := startEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const prefix = "/kvroute/test/"

	// An engine registered before the watcher starts, and one after.
	regA, stopA := context.WithCancel(ctx)
	doneA := make(chan error, 1)
	go func() { doneA <- etcd.Register(regA, c, prefix, engine("a", 8001), 2*time.Second) }()
	require.Eventually(t, func() bool {
		resp, err := c.Get(ctx, prefix+"a")
		return err == nil && len(resp.Kvs) == 1
	}, 10*time.Second, 20*time.Millisecond)

	r, err := router.New(router.Config{})
	require.NoError(t, err)
	eps := &epp.Endpoints{}
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, Addresses: eps})
	require.NoError(t, err)
	defer pool.Close()
	rec := &recorder{}
	w := &etcd.Watcher{Client: c, Prefix: prefix, Backoff: 50 * time.Millisecond}
	done := make(chan error, 1)
	go func() {
		done <- w.Run(ctx, sinks{pool, rec})
	}()
	idA := discovery.WorkerIDOf("a")
	require.Eventually(t, func() bool { return rec.names() == "a" }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []kvroute.WorkerKey{{ID: idA}}, r.Workers())
	addr, _ := eps.Address(kvroute.WorkerKey{ID: idA})
	require.Equal(t, "127.0.0.1:8001", addr)

	// b: a lease nobody keeps alive expires and takes b with it.
	lease, err := c.Grant(ctx, 2)
	require.NoError(t, err)
	vb, _ := json.Marshal(engine("b", 8002))
	_, err = c.Put(ctx, prefix+"b", string(vb), clientv3.WithLease(lease.ID))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.names() == "a,b" }, 10*time.Second, 10*time.Millisecond)
	require.Len(t, r.Workers(), 2)
	require.Eventually(t, func() bool { return rec.names() == "a" }, 15*time.Second, 50*time.Millisecond, "b's lease expired")
	require.Equal(t, []kvroute.WorkerKey{{ID: idA}}, r.Workers())

	// An invalid value is left out; the others stay.
	_, err = c.Put(ctx, prefix+"bad", `{"host":"x"}`)
	require.NoError(t, err)
	vc, _ := json.Marshal(engine("c", 8003))
	_, err = c.Put(ctx, prefix+"c", string(vc))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.names() == "a,c" }, 10*time.Second, 10*time.Millisecond)

	// a stops: its lease is revoked at once.
	stopA()
	require.ErrorIs(t, <-doneA, context.Canceled)
	require.Eventually(t, func() bool { return rec.names() == "c" }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []kvroute.WorkerKey{{ID: discovery.WorkerIDOf("c")}}, r.Workers())
	_, ok := eps.Address(kvroute.WorkerKey{ID: idA})
	require.False(t, ok)

	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

func TestDecode(t *testing.T) {
	e, err := etcd.Decode("vllm-0", []byte(`{"host":"10.0.0.7","ports":[8000,8001],"ready":true,"events":"tcp://10.0.0.7:5557"}`))
	require.NoError(t, err)
	require.Equal(t, "vllm-0", e.Name)
	require.Equal(t, "10.0.0.7:8001", e.Address(1))
	for _, bad := range []string{`{`, `{"host":"h","ports":[]}`, `{"host":"h","ports":[70000]}`, `{"ports":[1]}`,
		`{"host":"h","ports":[1,2],"events":"tcp://h"}`, `{"host":"h","ports":[1],"kind":"tgi"}`} {
		_, err := etcd.Decode("x", []byte(bad))
		require.ErrorIs(t, err, discovery.ErrEngine, bad)
	}
}

// sinks fans a sync out.
type sinks []discovery.Sink

func (s sinks) Sync(ctx context.Context, engines []discovery.Engine) {
	for _, k := range s {
		k.Sync(ctx, engines)
	}
}
