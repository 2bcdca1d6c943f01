package dynamo

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
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

// EngineSink adapts a discovery.Sink (a *discovery.Pool) to a Sink: each
// deployment is synced as its Engines.
func EngineSink(s discovery.Sink) Sink {
	return SinkFunc(func(ctx context.Context, d Deployment) { s.Sync(ctx, Engines(d)) })
}
