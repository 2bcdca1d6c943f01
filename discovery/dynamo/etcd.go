package dynamo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdWatcher follows Dynamo's etcd store (--discovery-backend etcd) and
// feeds the deployment a Selector picks to a Sink each time it changes.
//
// Dynamo puts each key under its process's lease (the lease id is the
// instance id; 30 s in Dynamo 1.6.1), so a worker that dies leaves when
// its lease expires, and one that stops cleanly at once. The
// watcher lists the buckets, then follows them from the listing's
// revision; when the watch breaks (compaction, a lost connection) it lists
// them again after Backoff.
type EtcdWatcher struct {
	// Client is the etcd client. Required.
	Client *clientv3.Client
	// Prefix is prepended to the bucket names; empty for Dynamo's keys
	// ("v1/instances/...").
	Prefix string
	// Selector picks the workers.
	Selector Selector
	// Logger receives invalid values and broken watches. Nil discards.
	Logger *slog.Logger
	// Backoff is the wait before listing again after an error. Zero
	// means one second.
	Backoff time.Duration
}

// Run lists the store, syncs the sink, and follows changes until ctx ends;
// it then returns ctx's error.
func (w *EtcdWatcher) Run(ctx context.Context, sink Sink) error {
	if w.Client == nil || sink == nil {
		return fmt.Errorf("%w: Client and a sink are required", ErrConfig)
	}
	log := w.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	backoff := w.Backoff
	if backoff <= 0 {
		backoff = time.Second
	}
	var last *Deployment
	sync := func(d Deployment) {
		if last == nil || !reflect.DeepEqual(*last, d) {
			logDeployment(ctx, log, d)
			sink.Sync(ctx, d)
			last = &d
		}
	}
	for {
		err := w.session(ctx, sync, log)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		log.WarnContext(ctx, "dynamo: etcd watch broke, listing again", "prefix", w.Prefix, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// session lists the buckets once and follows them until the watch fails.
func (w *EtcdWatcher) session(ctx context.Context, sync func(Deployment), log *slog.Logger) error {
	root := w.Prefix + "v1/"
	resp, err := w.Client.Get(ctx, root, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	var st State
	for _, kv := range resp.Kvs {
		w.put(ctx, &st, string(kv.Key), kv.Value, kv.Lease, log)
	}
	sync(st.Deployment(w.Selector))
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range w.Client.Watch(wctx, root, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return err
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				st.Delete(strings.TrimPrefix(string(ev.Kv.Key), w.Prefix))
			} else {
				w.put(ctx, &st, string(ev.Kv.Key), ev.Kv.Value, ev.Kv.Lease, log)
			}
		}
		sync(st.Deployment(w.Selector))
	}
	return errors.New("dynamo: etcd watch channel closed")
}

func (w *EtcdWatcher) put(ctx context.Context, st *State, key string, value []byte, lease int64, log *slog.Logger) {
	if err := st.Put(strings.TrimPrefix(key, w.Prefix), value, lease); err != nil {
		log.WarnContext(ctx, "dynamo: invalid store value left out", "key", key, "err", err)
	}
}
