// Package etcdwatch follows the keys under an etcd prefix: it lists them,
// watches them from the listing's revision, and lists them again after a
// pause whenever the watch breaks (compaction, a lost leader or
// connection), until its context ends.
package etcdwatch

import (
	"context"
	"errors"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultBackoff is the pause before listing again when Follow's backoff
// is zero or negative.
const DefaultBackoff = time.Second

// Change is one key's new value, or its deletion.
type Change struct {
	Key     string
	Value   []byte
	Lease   int64
	Deleted bool
}

// Handler receives what Follow reads. Relisted starts a new listing:
// everything the handler knew is replaced by the changes that follow it
// (all puts). Changed is called once per listing and once per watch
// response, with its changes in the store's order.
type Handler interface {
	Relisted()
	Changed(ctx context.Context, changes []Change)
}

// Follow lists and follows prefix with client until ctx ends, and then
// returns ctx's error. A broken watch or a failed listing is logged with
// what (a short name of the caller) and retried after backoff.
func Follow(ctx context.Context, client *clientv3.Client, prefix string, backoff time.Duration, log *slog.Logger, what string, h Handler) error {
	if backoff <= 0 {
		backoff = DefaultBackoff
	}
	for {
		err := session(ctx, client, prefix, h)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		log.WarnContext(ctx, what+": watch broke, listing again", "prefix", prefix, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// session lists prefix once and follows it until the watch fails.
func session(ctx context.Context, client *clientv3.Client, prefix string, h Handler) error {
	resp, err := client.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	changes := make([]Change, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		changes = append(changes, Change{Key: string(kv.Key), Value: kv.Value, Lease: kv.Lease})
	}
	h.Relisted()
	h.Changed(ctx, changes)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range client.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return err
		}
		changes = changes[:0]
		for _, ev := range wr.Events {
			changes = append(changes, Change{Key: string(ev.Kv.Key), Value: ev.Kv.Value, Lease: ev.Kv.Lease,
				Deleted: ev.Type == clientv3.EventTypeDelete})
		}
		h.Changed(ctx, changes)
	}
	return errors.New("watch channel closed")
}
