// Package gateway is an HTTP reverse proxy for OpenAI-compatible inference
// engines that routes every request with kvroute to the engine holding the
// longest cached prefix of its prompt.
//
// # Usage
//
// The host's duties, in order:
//
//  1. Create a router.Router with the engines' block size.
//  2. Describe each engine (Engine, or ParseEngine for a command-line
//     spec): its HTTP URL and, when it publishes KV events (vLLM
//     --kv-events-config), its ZMQ endpoints. Engines behind one shared
//     URL (a frontend that serves each request on the worker a header
//     names) carry their headers: Engine.Headers, or Engine.Preset
//     PresetDynamo for NVIDIA Dynamo's frontend in direct routing mode.
//  3. Create the Gateway with New and a Tokenizer that agrees with the
//     engines (RemoteTokenizer asks the engine itself; ModelTokenizer
//     reads the model directory and asks no one). A Tokenizer that is
//     also an MMTokenizer (RemoteTokenizer with Render) reports the
//     prompt's images, which the router hashes into the blocks as the
//     engines do, as it does the request's cache_salt.
//  4. Start Gateway.Run on a goroutine: it subscribes to every engine's KV
//     events (applied to the router's index) and probes their health
//     (router heartbeats), until its context ends.
//  5. Serve the Gateway with an http.Server; shut the server down before
//     cancelling Run's context.
//
// In code:
//
//	r, _ := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
//	gw, err := gateway.New(gateway.Config{
//		Router:    r,
//		Engines:   []gateway.Engine{{ID: 1, URL: "http://10.0.0.7:8000", Events: "tcp://10.0.0.7:5557"}},
//		Tokenizer: &gateway.RemoteTokenizer{URL: "http://10.0.0.7:8000"},
//	})
//	if err != nil {
//		return err
//	}
//	go gw.Run(ctx)
//	return http.ListenAndServe(":8080", gw)
//
// # Workers discovered elsewhere: Dynamo
//
// A router's workers need not be added to the gateway: a discovery source
// (discovery.Pool fed by package discovery/dynamo's store watchers, with
// package kvevents/dynamo applying the workers' KV events to the router's
// index) registers them in the router under their ids, and Config.Frontend
// says where their requests go. For an NVIDIA Dynamo deployment that is
// its frontend in direct routing mode with Preset PresetDynamo: every
// request reaches the frontend with the chosen worker's instance id in
// x-dynamo-worker-instance-id and its rank in x-dynamo-dp-rank (Dynamo's
// rank: the router's plus Config.FrontendDPStart's start rank, for the
// workers of a multi-node data-parallel deployment), and the prompt's
// token ids in the body's nvext.token_data, which the frontend takes
// instead of tokenizing the prompt again: the worker computes on exactly
// the tokens the router matched. Pass the
// Gateway as the event subscriber's load reporter (it is one: Heartbeat),
// so that Dynamo's load reports and the gateway's health probes of the
// frontend agree. The command examples/gateway does all of this with
// -dynamo-store and -dynamo-frontend.
//
// # Request lifecycle
//
// For POST /v1/completions and POST /v1/chat/completions the gateway reads
// the body, tokenizes the prompt, calls router.Router.Select and forwards
// the request to the chosen engine through an httputil.ReverseProxy.
// Streams (server-sent events) are relayed one event per flush; the first
// chunk calls Decision.PrefillDone and the end of the response
// Decision.Done, with the engine's usage.prompt_tokens_details.cached_tokens
// when it reports them. To learn them from a stream, the gateway asks for
// stream_options.include_usage when the client did not, and then keeps the
// usage-only chunk from the client.
//
// Failures: while nothing has reached the client (the engine cannot be
// reached, answers 429 or 5xx, refuses the worker its headers name, or its
// stream breaks before the first chunk) the request moves to another engine, up to Config.MaxAttempts;
// each failed attempt's decision is balanced by Done with the error, which
// counts against the engine's health, except an engine's 429 and the 4xx
// answers relayed to the client, which say nothing of its health either
// way (router.ErrNoVerdict). A stream that breaks later ends with
// an OpenAI error event and [DONE]. Every request gets exactly one answer
// and every decision exactly one Done.
//
// Responses carry HeaderWorker and HeaderPredictedCached.
//
// The default transport (NewTransport) keeps connections to the engines
// alive and acknowledges what they send at once (TCP_QUICKACK, on Linux):
// an engine or frontend that leaves Nagle's algorithm on, as Dynamo's
// frontend does, would otherwise hold a stream's first chunk back until
// Linux's delayed acknowledgement of the response headers, up to 40 ms.
//
// # Health and load
//
// Run probes each distinct engine URL's HealthPath every HealthInterval
// (engines sharing a URL share one probe): a success is a router
// heartbeat that marks the engine alive and repeats the last load a load
// source reported through Gateway.Heartbeat (an enginemetrics.Scraper
// given the Gateway as its Reporter, or Dynamo's load events), so that a
// probe never erases a load report. Each round of probes ends with the
// router's timed housekeeping (Router.CheckHealth); with probing disabled
// (a negative HealthInterval) Run still does that every second, so that an
// engine unhealthy from errors is given requests again after the router's
// UnhealthyAfter.
package gateway
