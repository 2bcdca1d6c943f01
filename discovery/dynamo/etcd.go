package dynamo

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvroute/kvroute/internal/etcdwatch"
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
	f := &etcdFollower{w: w, sink: sink, log: log}
	return etcdwatch.Follow(ctx, w.Client, w.Prefix+"v1/", w.Backoff, log, "dynamo: etcd", f)
}

// etcdFollower keeps the store of one listing and the watch after it, and
// syncs the sink when the selected deployment changes.
type etcdFollower struct {
	w    *EtcdWatcher
	sink Sink
	log  *slog.Logger
	st   State
	last *Deployment
}

func (f *etcdFollower) Relisted() { f.st = State{} }

func (f *etcdFollower) Changed(ctx context.Context, changes []etcdwatch.Change) {
	for _, c := range changes {
		if c.Deleted {
			f.st.Delete(strings.TrimPrefix(c.Key, f.w.Prefix))
		} else {
			f.w.put(ctx, &f.st, c.Key, c.Value, c.Lease, f.log)
		}
	}
	d := f.st.Deployment(f.w.Selector)
	if f.last == nil || !reflect.DeepEqual(*f.last, d) {
		logDeployment(ctx, f.log, d)
		f.sink.Sync(ctx, d)
		f.last = &d
	}
}

func (w *EtcdWatcher) put(ctx context.Context, st *State, key string, value []byte, lease int64, log *slog.Logger) {
	if err := st.Put(strings.TrimPrefix(key, w.Prefix), value, lease); err != nil {
		log.WarnContext(ctx, "dynamo: invalid store value left out", "key", key, "err", err)
	}
}
