// Package discovery keeps a router's workers in step with the inference
// engines that come and go: a Pool turns the set of engines a source
// reports (package discovery/etcd, package discovery/kube, or the host's
// own) into AddWorker and RemoveWorker calls, endpoint addresses for an
// Endpoint Picker, KV-event subscriptions and metrics scrapers.
//
// # Usage
//
//  1. Create the router, an epp.Endpoints (or any AddressBook), and
//     optionally an enginemetrics.Scraper.
//  2. Create a Pool with NewPool.
//  3. Run a source that calls Pool.Sync with the full set of engines each
//     time it changes (etcd.Watch, kube.Watch), or call Sync yourself.
//  4. Close the Pool when done: it stops every subscriber and scraper it
//     started.
//
// In code:
//
//	pool, err := discovery.NewPool(discovery.PoolConfig{Router: r, Addresses: eps, Scraper: scraper})
//	if err != nil {
//		return err
//	}
//	defer pool.Close()
//	return etcd.Watch(ctx, client, "/kvroute/pool-a/", pool)
//
// # Engines
//
// An Engine names its worker id, host and one HTTP port per data-parallel
// rank (rank r is the cache domain {ID, r}, served at host:Ports[r]), its
// ZMQ KV-event endpoint (rank r publishes on the port plus r, as vLLM
// does) and its metrics URL. Engines that are not Ready are treated as
// absent. When a scraper is configured, an engine is registered only after
// its first scrape shows the router's block size (see
// enginemetrics.Scraper.Verify); an engine that fails the check is reported by
// Pool.Rejected and tried again every PoolConfig.RetryInterval.
//
// An engine reached through a shared URL with a per-worker header (NVIDIA
// Dynamo's frontend in direct mode, package discovery/dynamo) has no host
// or ports: it names its number of Ranks, gets no AddressBook entry, and
// may carry its block size (checked against the router's), its KV capacity
// and batch limits (given to the router), and its Dynamo event-plane
// endpoints, which PoolConfig.DynamoEvents subscribes to while the engine
// is a member.
package discovery
