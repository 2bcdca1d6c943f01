package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvroute/kvroute/discovery"
	dyndisc "github.com/kvroute/kvroute/discovery/dynamo"
	"github.com/kvroute/kvroute/examples/gateway/gateway"
	kvdynamo "github.com/kvroute/kvroute/kvevents/dynamo"
	"github.com/kvroute/kvroute/router"
)

// dynamoConfig is the gateway's Dynamo mode: the workers of an NVIDIA
// Dynamo deployment, discovered from its store, served through its
// frontend (started with --router-mode direct).
type dynamoConfig struct {
	// Store is the deployment's discovery store: "file:DIR" (the
	// workers' DYN_FILE_KV) or "etcd:URL[,URL...]" (ETCD_ENDPOINTS).
	// Empty disables the Dynamo mode.
	Store string `json:"store"`
	// Frontend is the frontend's base URL.
	Frontend string `json:"frontend"`
	// Model, Namespace, Component and Endpoint select the workers; empty
	// matches any.
	Model     string `json:"model,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Component string `json:"component,omitempty"`
	Endpoint  string `json:"endpoint,omitempty"`
	// CallbackHost is the address Dynamo workers connect back to when
	// the gateway asks their local indexer for events it missed (Dynamo's
	// DYN_TCP_RESPONSE_STREAM_HOST). Empty means that variable, or
	// 127.0.0.1.
	CallbackHost string `json:"callback_host,omitempty"`
}

// validate checks the configuration of an enabled Dynamo mode.
func (c *dynamoConfig) validate() error {
	kind, where, _ := strings.Cut(c.Store, ":")
	if (kind != "file" && kind != "etcd") || strings.Trim(where, ", ") == "" {
		return fmt.Errorf("-dynamo-store %q is neither file:DIR nor etcd:URL[,URL...]", c.Store)
	}
	if c.Frontend == "" {
		return errors.New("-dynamo-store needs -dynamo-frontend, the URL of Dynamo's frontend in direct routing mode")
	}
	return nil
}

// frontend returns the gateway's Config.Frontend.
func (c *dynamoConfig) frontend() *gateway.Engine {
	return &gateway.Engine{URL: c.Frontend, Preset: gateway.PresetDynamo}
}

// dpStarts gives the gateway the start ranks of the workers whose
// data-parallel ranks do not start at 0 (multi-node data parallelism),
// as the Dynamo mode's subscriber learns them from the store, so that
// x-dynamo-dp-rank carries Dynamo's rank; 0 until the subscriber exists,
// when no worker is registered yet.
type dpStarts struct {
	sub atomic.Pointer[kvdynamo.Subscriber]
}

// get returns worker's start rank.
func (s *dpStarts) get(worker uint64) int {
	if sub := s.sub.Load(); sub != nil {
		return sub.DPStartRank(worker)
	}
	return 0
}

// dynamoMode follows a Dynamo deployment: its workers (registered in the
// router with their instance ids) from the store, their KV events and
// load reports from its event plane. Nothing is probed and no port is
// opened.
type dynamoMode struct {
	sub   *kvdynamo.Subscriber
	pool  *discovery.Pool
	etcd  *clientv3.Client
	run   func(ctx context.Context, sink dyndisc.Sink) error
	close sync.Once
}

// newDynamoMode prepares the Dynamo mode: events go to the router's index,
// load reports to the gateway (which keeps them across its health probes).
// Its pool and store client run from here on: Run ends them, and Close
// when Run is not called.
func newDynamoMode(c dynamoConfig, r *router.Router, gw *gateway.Gateway, log *slog.Logger) (*dynamoMode, error) {
	sub, err := kvdynamo.New(kvdynamo.Config{Sink: r.Index(), Load: gw, Logger: log.With("part", "dynamo-events"),
		Query: kvdynamo.Querier{CallbackHost: cmp.Or(c.CallbackHost, os.Getenv("DYN_TCP_RESPONSE_STREAM_HOST"))}})
	if err != nil {
		return nil, err
	}
	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, DynamoEvents: dyndisc.KVEvents(sub), Logger: log.With("part", "dynamo-pool")})
	if err != nil {
		return nil, err
	}
	m := &dynamoMode{sub: sub, pool: pool}
	sel := dyndisc.Selector{Namespace: c.Namespace, Component: c.Component, Endpoint: c.Endpoint, Model: c.Model}
	kind, where, _ := strings.Cut(c.Store, ":")
	switch kind {
	case "file":
		w := &dyndisc.FileWatcher{Dir: where, Selector: sel, Logger: log.With("part", "dynamo-store")}
		m.run = w.Run
	case "etcd":
		// Not tied to a context: Run and Close close it, after the
		// watcher that uses it has stopped.
		client, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(where, ","), DialTimeout: 5 * time.Second})
		if err != nil {
			_ = pool.Close()
			return nil, fmt.Errorf("etcd %s: %w", where, err)
		}
		m.etcd = client
		w := &dyndisc.EtcdWatcher{Client: client, Selector: sel, Logger: log.With("part", "dynamo-store")}
		m.run = w.Run
	}
	return m, nil
}

// Run follows the deployment until ctx ends, then removes its workers
// from the router.
func (m *dynamoMode) Run(ctx context.Context) error {
	// The subscriber outlives the watcher, so that the pool removes its
	// workers' publishers from a running subscriber.
	subCtx, stopSub := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { _ = m.sub.Run(subCtx) })
	err := m.run(ctx, dyndisc.PoolSink(m.pool, m.sub))
	_ = m.pool.Close()
	stopSub()
	wg.Wait()
	m.Close()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// Close stops what newDynamoMode started, in the reverse order: the store
// client, then the pool (removing its workers from the router). It is for
// a gateway that stops before Run, and harmless after Run and when
// repeated.
func (m *dynamoMode) Close() {
	m.close.Do(func() {
		if m.etcd != nil {
			_ = m.etcd.Close()
		}
		_ = m.pool.Close()
	})
}
