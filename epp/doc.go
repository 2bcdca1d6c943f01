// Package epp is an Endpoint Picker for Envoy-based gateways: an Envoy
// ext_proc ExternalProcessor that picks, for every inference request, the
// model server of an InferencePool that holds the longest cached prefix of
// its prompt, following the Gateway API Inference Extension's Endpoint
// Picker Protocol.
//
// # Usage
//
// The host's duties, in order:
//
//  1. Create a router.Router with the engines' block size, and feed its
//     index with the engines' KV events (package kvevents/zmq).
//  2. Keep the router's workers and an Endpoints table in step with the
//     pool: AddWorker/RemoveWorker and Endpoints.Set/DeleteWorker, from
//     discovery (package discovery) or configuration. Report engine load
//     with Router.Heartbeat (package enginemetrics).
//  3. Create the Server with New and a Tokenizer that agrees with the
//     engines (package render asks the engines themselves), register it
//     on a grpc.Server with Register, and serve it.
//  4. Call SetReady(true) once the endpoints are known.
//
// In code:
//
//	r, _ := router.New(router.Config{Hasher: kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 16})})
//	eps := &epp.Endpoints{}
//	_ = r.AddWorker(router.StaticWorker{WorkerID: 1, Block: 16})
//	_ = eps.Set(kvroute.WorkerKey{ID: 1}, "10.0.0.7:8000")
//	picker, err := epp.New(epp.Config{Router: r, Endpoints: eps, Tokenizer: tok})
//	if err != nil {
//		return err
//	}
//	g := grpc.NewServer()
//	picker.Register(g)
//	picker.SetReady(true)
//	return g.Serve(listener) // port 9002 in GIE's manifests
//
// # Protocol
//
// Envoy's ext_proc filter runs in FULL_DUPLEX_STREAMED mode for the
// request and response bodies, and forwards the "envoy.lb" and
// "envoy.lb.subset_hint" metadata namespaces. Per HTTP request, on one
// gRPC stream:
//
//   - Request headers: the picker reads :path, x-request-id and the
//     subset hint (filter metadata "envoy.lb.subset_hint", key
//     x-gateway-destination-endpoint-subset: only those endpoints may be
//     picked). It answers nothing yet, unless the headers end the request
//     (a GET): then it picks by load alone.
//   - Request body chunks: buffered up to Config.MaxBodyBytes (413 beyond).
//     At the end of the body it parses /v1/completions and
//     /v1/chat/completions (400 when malformed; other paths are routed by
//     load alone), tokenizes the prompt, maps the model to its LoRA adapter
//     (Config.Adapters) and calls Router.Select. It answers the headers
//     with x-gateway-destination-endpoint set to the picked endpoint
//     followed by up to Config.Fallbacks others, cheapest first
//     ("ip:port,ip:port"), the same value in dynamic_metadata["envoy.lb"],
//     and then streams the body back (with stream_options.include_usage
//     added when Config.InjectUsage is set).
//   - Immediate responses: 503 when no endpoint is eligible (none known,
//     none in the subset, none healthy) and 429 when the router sheds the
//     request (every endpoint busy, admission queue full).
//   - Response headers: the :status, the content type and the endpoint that
//     served the request (filter metadata "envoy.lb", key
//     x-gateway-destination-endpoint-served). Plain Envoy does not fill that
//     key; when it is absent the picker reads Envoy's "upstream.address"
//     attribute instead, which Envoy sends when the ext_proc filter sets
//     response_attributes: ["upstream.address"]. When Envoy served the
//     request on a fallback (a retry after an error), the picked
//     endpoint's decision ends with ErrServedElsewhere and the request is
//     tracked, pinned, on the served one, so that its outcome counts
//     there. Without either report, every outcome counts on the pick.
//   - Response body chunks: the first calls Decision.PrefillDone; each is
//     relayed (server-sent events are scanned for the usage chunk).
//   - End of the response: Decision.Done with the engine's
//     usage.prompt_tokens_details.cached_tokens when it reported them, or
//     with ErrEngineStatus for a 429 or 5xx answer. A 429 (the engine
//     overloaded) and any other 4xx (the request refused) also wrap
//     router.ErrNoVerdict: they neither count against the engine nor
//     clear its errors as a success would. A stream that ends
//     before the response does (client cancel, Envoy gone) ends the
//     decision with an error wrapping context.Canceled, which does not
//     count against the engine; that includes a stream that ends between
//     the response headers and the first body chunk when the protocol
//     configuration of its first message (Envoy 1.33 and later) says Envoy
//     sends the picker the response body.
//
// Every Select is balanced by exactly one Done, whatever the order of the
// messages (a fuzz target plays arbitrary sequences); request headers sent
// twice end the stream with codes.InvalidArgument (ErrProtocol). Set Envoy's ext_proc
// message_timeout above the longest wait in the router's admission queue
// (Config.Queue), since the picker answers the body only once Select
// returns.
//
// # Health
//
// Register also serves the gRPC health protocol: "liveness" is always
// SERVING; "readiness", "" and the ext_proc service name follow SetReady.
//
// # Metrics
//
// Stats counts decisions, rejections, cancellations and, for requests whose
// engine reported its cached tokens, the predicted against the actual
// cached tokens and blocks.
package epp
