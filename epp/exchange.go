package epp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/render"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// Errors given to Decision.Done.
var (
	// ErrEngineStatus: the engine answered 429 or a 5xx status. A 429's
	// error also wraps router.ErrNoVerdict: an overloaded engine is not
	// a failing one.
	ErrEngineStatus = errors.New("epp: engine error status")
	// ErrServedElsewhere: the data plane served the request on another
	// endpoint of the list, so the picked one failed.
	ErrServedElsewhere = errors.New("epp: served on a fallback endpoint")
	// ErrProtocol: the data plane sent a message out of sequence (request
	// headers twice); the stream ends with codes.InvalidArgument.
	ErrProtocol = errors.New("epp: ext_proc message out of sequence")
)

// maxChunk bounds the body of one streamed body response.
const maxChunk = 62 * 1000

// exchange is the state of one ext_proc stream: one HTTP request and its
// response. It is used by the stream's goroutine only.
type exchange struct {
	s      *Server
	stream extprocv3.ExternalProcessor_ProcessServer
	ctx    context.Context

	// Request side.
	path      string
	requestID string
	subset    map[string]bool // nil: no hint
	body      []byte
	headers   bool // the request headers came
	routed    bool // the headers and body responses are sent
	rewritten bool // the body was changed
	injected  bool // stream_options.include_usage was added

	// The decision and what re-pinning it needs.
	d      *router.Decision
	tokens []uint32
	lora   string
	salt   string
	mm     []kvroute.MMObject
	picked []string // addresses, the first is the pick

	// bodyMode is how Envoy sends the response body to the picker, from
	// the protocol configuration of the stream's first message; NONE when
	// Envoy sent none (versions before 1.33 send no configuration).
	bodyMode extprocfilterv3.ProcessingMode_BodySendMode

	// Response side.
	status    int
	statusErr error // a 429 or 5xx answer's
	clientErr error // a 4xx answer's but 429: the request's fault
	streaming bool
	firstBody bool
	served    bool // the served endpoint was checked
	scanner   openai.EventScanner
	respBuf   []byte
	respOver  bool
	respEnded bool // the response body ended (responseEnd ran)
	usage     openai.Usage
	hasUsage  bool
	finished  bool
}

func (e *exchange) run() error {
	e.s.stats.streams.Add(1)
	for {
		msg, err := e.stream.Recv()
		if err != nil {
			return e.closed(err)
		}
		stop, err := e.handle(msg)
		if err != nil {
			e.finishCanceled()
			return err
		}
		if stop {
			e.finishCanceled()
			return nil
		}
	}
}

// closed ends the exchange when the stream ends, balancing the decision.
// An engine error status counts as the engine's failure. A graceful close
// after response headers that came without error counts as success when
// Envoy sends the picker no response body (its protocol configuration
// says so, or it sent none, as Envoy before 1.33 does); response headers
// that end the response finish the exchange when they come.
// Anything else is a cancellation, which is not the engine's fault: in
// particular a close before or in the middle of a response body the
// picker was to see, which is how Envoy ends the stream when the client
// goes away.
func (e *exchange) closed(err error) error {
	graceful := errors.Is(err, io.EOF)
	switch {
	case e.d == nil || e.finished:
	case e.statusErr != nil, e.clientErr != nil, graceful && e.status != 0 && !e.firstBody && e.bodyMode == extprocfilterv3.ProcessingMode_NONE:
		e.finish()
	default:
		e.finishCanceled()
	}
	if graceful || errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
		return nil
	}
	return err
}

// handle processes one message; stop is set when the exchange is over
// (an immediate response was sent).
func (e *exchange) handle(msg *extprocv3.ProcessingRequest) (stop bool, err error) {
	if pc := msg.GetProtocolConfig(); pc != nil {
		e.bodyMode = pc.GetResponseBodyMode()
	}
	if e.d != nil && !e.served {
		e.checkServed(msg)
	}
	switch m := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if e.headers || e.routed {
			return true, status.Errorf(codes.InvalidArgument, "%v: request headers again", ErrProtocol)
		}
		e.headers = true
		e.requestHeaders(m.RequestHeaders, msg.GetMetadataContext())
		if m.RequestHeaders.GetEndOfStream() {
			return e.route(false, true)
		}
	case *extprocv3.ProcessingRequest_RequestBody:
		if e.routed {
			return false, e.sendBody(true, m.RequestBody.GetBody(), m.RequestBody.GetEndOfStream())
		}
		if len(e.body)+len(m.RequestBody.GetBody()) > e.s.cfg.MaxBodyBytes {
			e.s.stats.badRequests.Add(1)
			return true, e.reject(413, "invalid_request_error", fmt.Sprintf("request body larger than %d bytes", e.s.cfg.MaxBodyBytes))
		}
		e.body = append(e.body, m.RequestBody.GetBody()...)
		if m.RequestBody.GetEndOfStream() {
			return e.route(true, false)
		}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if !e.routed {
			// The body ended with the trailers.
			if stop, err := e.route(false, false); stop || err != nil {
				return stop, err
			}
		}
		return false, e.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		e.checkServed(msg)
		e.responseHeaders(m.ResponseHeaders)
		if err := e.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
			ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}}); err != nil {
			return false, err
		}
		if m.ResponseHeaders.GetEndOfStream() {
			e.finish()
		}
	case *extprocv3.ProcessingRequest_ResponseBody:
		return false, e.responseBody(m.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		// The trailers end the body: what the picker still holds of it
		// goes on before them.
		if tail := e.responseEnd(); len(tail) > 0 {
			if err := e.sendBody(false, tail, false); err != nil {
				return false, err
			}
		}
		e.finish()
		return false, e.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return false, nil
}

// headerValue returns a header's value, raw or not.
func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

func (e *exchange) requestHeaders(h *extprocv3.HttpHeaders, md *corev3.Metadata) {
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch strings.ToLower(hv.GetKey()) {
		case ":path":
			e.path = headerValue(hv)
		case "x-request-id":
			e.requestID = headerValue(hv)
		}
	}
	e.subset = subsetHint(md)
}

// subsetHint reads the endpoint subset from the request's filter
// metadata: a list of "ip:port" strings (a comma-separated string is
// accepted too). It returns nil without a hint, and an empty map for an
// empty one.
func subsetHint(md *corev3.Metadata) map[string]bool {
	ns := md.GetFilterMetadata()[NamespaceSubset]
	v, ok := ns.GetFields()[KeySubset]
	if !ok {
		return nil
	}
	out := map[string]bool{}
	add := func(s string) {
		for _, a := range strings.Split(s, ",") {
			if a = strings.TrimSpace(a); a != "" {
				out[a] = true
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		add(k.StringValue)
	case *structpb.Value_ListValue:
		for _, item := range k.ListValue.GetValues() {
			add(item.GetStringValue())
		}
	}
	return out
}

// route picks the endpoints once the request body is complete (eos: the
// body's last chunk carried end_of_stream; noBody: the headers did) and
// sends the headers response and the body. It answers 400, 503 or 429
// instead when it cannot.
func (e *exchange) route(eos, noBody bool) (bool, error) {
	cfg := &e.s.cfg
	body := e.body
	var rr router.Request
	if kind, ok := openai.KindOfPath(e.path); ok {
		req, err := openai.ParseRequest(body, kind)
		if err != nil {
			e.s.stats.badRequests.Add(1)
			return true, e.reject(400, "invalid_request_error", err.Error())
		}
		if a, ok := cfg.Adapters[req.Model]; ok {
			if err := req.SetModel(a); err != nil {
				e.s.stats.badRequests.Add(1)
				return true, e.reject(400, "invalid_request_error", err.Error())
			}
		}
		if e.s.adapters[req.Model] {
			rr.LoRA = req.Model
		}
		rr.CacheSalt = req.CacheSalt
		if rr.Tokens, rr.MM, err = render.TokenizeAll(e.ctx, cfg.Tokenizer, req); err != nil {
			if e.ctx.Err() != nil {
				return true, nil
			}
			e.s.stats.tokenizeErrors.Add(1)
			e.s.log.WarnContext(e.ctx, "epp: cannot tokenize, routing by load alone",
				"request_id", e.requestID, "model", req.Model, "err", err)
			rr.Tokens, rr.MM = nil, nil
		}
		nb, changed, err := req.Rewrite(cfg.InjectUsage)
		if err != nil {
			e.s.stats.badRequests.Add(1)
			return true, e.reject(400, "invalid_request_error", err.Error())
		}
		if changed {
			body, e.rewritten = nb, true
			e.injected = cfg.InjectUsage && req.Stream && !req.IncludeUsage
		}
	}
	var allowed int
	rr.Exclude, allowed = cfg.Endpoints.exclusions(nil, cfg.Router.Workers(), e.subset)
	if allowed == 0 {
		e.s.stats.unavailable.Add(1)
		return true, e.reject(503, "service_unavailable", "no eligible endpoint")
	}
	rr.Explain = cfg.Fallbacks > 0
	d, err := cfg.Router.Select(e.ctx, &rr)
	if err != nil {
		return e.rejectSelect(err)
	}
	primary, ok := cfg.Endpoints.Address(d.Worker)
	if !ok {
		// Removed between the exclusions and the pick.
		d.Done(router.Outcome{Err: fmt.Errorf("epp: %s has no endpoint: %w", d.Worker, context.Canceled)})
		e.s.stats.unavailable.Add(1)
		return true, e.reject(503, "service_unavailable", "no eligible endpoint")
	}
	e.d, e.tokens, e.lora, e.salt, e.mm = d, rr.Tokens, rr.LoRA, rr.CacheSalt, rr.MM
	e.picked = append(e.picked[:0], primary)
	e.picked = append(e.picked, e.fallbacks(d)...)
	e.s.stats.routed.Add(1)
	e.s.log.DebugContext(e.ctx, "epp: picked", "request_id", e.requestID, "worker", d.Worker.String(),
		"endpoints", e.picked, "prompt_tokens", d.PromptTokens, "cached_tokens", d.CachedTokens)

	if err := e.send(e.headersResponse(body, noBody)); err != nil {
		return false, err
	}
	e.routed = true
	if noBody {
		return false, nil
	}
	return false, e.sendBody(true, body, eos)
}

// rejectSelect answers a failed Select: 429 when shedding, 503 when
// nothing is eligible; nothing when the stream ended.
func (e *exchange) rejectSelect(err error) (bool, error) {
	switch {
	case e.ctx.Err() != nil:
		return true, nil
	case errors.Is(err, scheduling.ErrAllBusy), errors.Is(err, scheduling.ErrQueueFull), errors.Is(err, scheduling.ErrQueueClosed):
		e.s.stats.shed.Add(1)
		e.s.log.WarnContext(e.ctx, "epp: shedding", "request_id", e.requestID, "err", err)
		return true, e.reject(429, "rate_limit_exceeded", err.Error())
	default:
		e.s.stats.unavailable.Add(1)
		e.s.log.WarnContext(e.ctx, "epp: no endpoint", "request_id", e.requestID, "err", err)
		return true, e.reject(503, "service_unavailable", err.Error())
	}
}

// fallbacks returns the addresses of the decision's other candidates,
// cheapest first, up to Config.Fallbacks.
func (e *exchange) fallbacks(d *router.Decision) []string {
	n := e.s.cfg.Fallbacks
	if n == 0 || len(d.Candidates) < 2 {
		return nil
	}
	cands := slices.Clone(d.Candidates)
	slices.SortStableFunc(cands, func(a, b router.CandidateCost) int { return cmp.Compare(a.Cost, b.Cost) })
	var out []string
	for _, c := range cands {
		if len(out) == n {
			break
		}
		if c.Worker == d.Worker {
			continue
		}
		if a, ok := e.s.cfg.Endpoints.Address(c.Worker); ok && !slices.Contains(out, a) && a != e.picked[0] {
			out = append(out, a)
		}
	}
	return out
}

// headersResponse names the picked endpoints in a header and in the
// dynamic metadata, with the same value.
func (e *exchange) headersResponse(body []byte, noBody bool) *extprocv3.ProcessingResponse {
	value := strings.Join(e.picked, ",")
	set := []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: HeaderDestination, RawValue: []byte(value)}}}
	if e.rewritten && !noBody {
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))}})
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		NamespaceLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			HeaderDestination: structpb.NewStringValue(value),
		}}),
	}}
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{
				ClearRouteCache: true,
				HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set},
			},
		}},
		DynamicMetadata: md,
	}
}

// sendBody sends body as streamed body responses of at most maxChunk
// bytes, the request's (request set) or the response's; the last carries
// eos. An empty body is sent as one empty response.
func (e *exchange) sendBody(request bool, body []byte, eos bool) error {
	for {
		n := min(len(body), maxChunk)
		last := n == len(body)
		br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
				Body: body[:n], EndOfStream: eos && last,
			}},
		}}}
		resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
		if request {
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
		}
		if err := e.send(resp); err != nil {
			return err
		}
		if last {
			return nil
		}
		body = body[n:]
	}
}

func (e *exchange) send(resp *extprocv3.ProcessingResponse) error {
	if err := e.stream.Send(resp); err != nil {
		return fmt.Errorf("epp: sending to the data plane: %w", err)
	}
	return nil
}

// reject sends an immediate response with an OpenAI error body.
func (e *exchange) reject(code int, typ, msg string) error {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": code}})
	return e.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")}},
			}},
			Body:    body,
			Details: "kvroute_epp: " + msg,
		},
	}})
}

// servedEndpoint returns the endpoint the data plane reports as having
// served the request: the KeyServed filter metadata of the Endpoint
// Picker Protocol, or else Envoy's upstream.address attribute.
func servedEndpoint(msg *extprocv3.ProcessingRequest) (string, bool) {
	if v, ok := msg.GetMetadataContext().GetFilterMetadata()[NamespaceLB].GetFields()[KeyServed]; ok {
		return strings.TrimSpace(v.GetStringValue()), true
	}
	if v, ok := msg.GetAttributes()[AttributesExtProc].GetFields()[AttributeUpstream]; ok {
		if a := strings.TrimSpace(v.GetStringValue()); a != "" {
			return a, true
		}
	}
	return "", false
}

// checkServed reads the endpoint that served the request. When it is not
// the one picked first, the picked one failed: its decision ends with
// ErrServedElsewhere and the request is tracked on the served endpoint.
func (e *exchange) checkServed(msg *extprocv3.ProcessingRequest) {
	served, ok := servedEndpoint(msg)
	if !ok || e.d == nil || e.finished || len(e.picked) == 0 {
		return
	}
	e.served = true
	if served == e.picked[0] {
		return
	}
	key, ok := e.s.cfg.Endpoints.Key(served)
	if !ok {
		e.s.log.WarnContext(e.ctx, "epp: served by an unknown endpoint", "request_id", e.requestID, "served", served)
		return
	}
	e.s.stats.servedElsewhere.Add(1)
	e.d.Done(router.Outcome{Err: fmt.Errorf("%w: %s", ErrServedElsewhere, served)})
	e.picked = append(e.picked[:0], served)
	// The request runs there already: track it, past the busy thresholds
	// and the admission queue.
	d, err := e.s.cfg.Router.Select(e.ctx, &router.Request{Tokens: e.tokens, LoRA: e.lora, CacheSalt: e.salt, MM: e.mm,
		Pin: key, HasPin: true, Admitted: true})
	if err != nil {
		e.s.log.WarnContext(e.ctx, "epp: cannot track the request on the endpoint that served it",
			"request_id", e.requestID, "served", served, "err", err)
		e.d = nil
		return
	}
	e.d = d
}

func (e *exchange) responseHeaders(h *extprocv3.HttpHeaders) {
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch strings.ToLower(hv.GetKey()) {
		case ":status":
			e.status, _ = strconv.Atoi(headerValue(hv))
		case "content-type":
			e.streaming = strings.Contains(headerValue(hv), "text/event-stream")
		}
	}
	switch {
	case e.status == 429:
		// The engine is overloaded, which says nothing of its health.
		e.statusErr = fmt.Errorf("%w %d: %w", ErrEngineStatus, e.status, router.ErrNoVerdict)
	case e.status >= 500:
		e.statusErr = fmt.Errorf("%w %d", ErrEngineStatus, e.status)
	case e.status >= 400:
		// The engine judged the request invalid: no error of the
		// engine's, nor a success that would clear its errors.
		e.clientErr = fmt.Errorf("epp: engine answered %d: %w", e.status, router.ErrNoVerdict)
	}
}

// responseBody relays a chunk of the response: the first one ends the
// prefill; streams are scanned for the usage chunk (removed when the
// picker asked for it), JSON bodies kept up to the limit to read theirs.
func (e *exchange) responseBody(b *extprocv3.HttpBody) error {
	if e.d != nil && !e.firstBody {
		e.firstBody = true
		e.d.PrefillDone()
	}
	chunk, eos := b.GetBody(), b.GetEndOfStream()
	out := chunk
	switch {
	case e.streaming && e.injected:
		out = nil
		e.scanner.Write(chunk, func(ev *openai.Event) {
			e.noteEvent(ev)
			if !ev.UsageOnly {
				out = append(out, ev.Raw...)
			}
		})
	case e.streaming:
		e.scanner.Write(chunk, e.noteEvent)
	case !e.respOver:
		if len(e.respBuf)+len(chunk) > e.s.cfg.MaxBodyBytes {
			e.respOver, e.respBuf = true, nil
		} else {
			e.respBuf = append(e.respBuf, chunk...)
		}
	}
	if eos {
		out = append(out, e.responseEnd()...)
	}
	if err := e.sendBody(false, out, eos); err != nil {
		return err
	}
	if eos {
		e.finish()
	}
	return nil
}

// responseEnd is called once the response body has ended (with its last
// chunk or with trailers): it reads a JSON body's usage and returns what
// the scanner still holds of a stream whose usage chunk the picker
// removes, for the client.
func (e *exchange) responseEnd() []byte {
	if e.respEnded {
		return nil
	}
	e.respEnded = true
	switch {
	case e.streaming && e.injected:
		return e.scanner.Flush()
	case !e.streaming && !e.respOver:
		e.usage, e.hasUsage = openai.ParseUsage(e.respBuf)
	}
	return nil
}

func (e *exchange) noteEvent(ev *openai.Event) {
	if ev.HasUsage {
		e.usage, e.hasUsage = ev.Usage, true
	}
}

// finish balances the decision with the response's outcome.
func (e *exchange) finish() {
	if e.d == nil || e.finished {
		return
	}
	e.finished = true
	st := &e.s.stats
	st.completed.Add(1)
	o := router.Outcome{Err: e.statusErr}
	switch {
	case o.Err != nil:
		st.engineErrors.Add(1)
	case e.clientErr != nil:
		o.Err = e.clientErr
	case e.hasUsage && e.usage.CachedKnown:
		o.CachedTokens, o.CachedTokensKnown = e.usage.CachedTokens, true
		bs := e.s.cfg.Router.Hasher().BlockSize()
		st.predictedTokens.Add(uint64(e.d.CachedTokens))
		st.predictedBlocks.Add(uint64(e.d.CachedBlocks))
		st.actualTokens.Add(uint64(e.usage.CachedTokens))
		st.actualBlocks.Add(uint64(e.usage.CachedTokens / bs))
		st.promptTokens.Add(uint64(e.d.PromptTokens))
	}
	e.d.Done(o)
}

// abandon balances the decision of an exchange that a panic ended, as a
// cancellation; a panic on the way is logged and ends there.
func (e *exchange) abandon() {
	defer func() {
		if p := recover(); p != nil {
			e.s.log.Error("epp: panic while balancing an abandoned request", "panic", p)
		}
	}()
	e.finishCanceled()
}

// finishCanceled balances the decision of an exchange that ended before
// its response did.
func (e *exchange) finishCanceled() {
	if e.d == nil || e.finished {
		return
	}
	e.finished = true
	e.s.stats.canceled.Add(1)
	e.d.Done(router.Outcome{Err: fmt.Errorf("epp: stream ended before the response: %w", context.Canceled)})
}
