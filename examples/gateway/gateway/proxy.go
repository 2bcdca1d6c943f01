package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/render"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// Response headers the gateway adds to every answer an engine gave.
const (
	// HeaderWorker names the cache domain that served the request
	// ("id/rank").
	HeaderWorker = "X-Kvroute-Worker"
	// HeaderPredictedCached is the number of prompt tokens the router
	// expected the engine to find in its cache.
	HeaderPredictedCached = "X-Kvroute-Predicted-Cached-Tokens"
)

// adapter maps the request's model to its LoRA adapter (Config.Adapters),
// rewriting the model the engine sees, and returns the adapter the
// engine caches the request's blocks under: empty for the base model.
func (g *Gateway) adapter(req *apiRequest) (string, error) {
	if a, ok := g.adapters[req.Model]; ok {
		if err := req.SetModel(a); err != nil {
			return "", fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
	}
	for _, a := range g.adapters {
		if a == req.Model {
			return a, nil
		}
	}
	return "", nil
}

// ServeHTTP implements http.Handler: POST /v1/completions and
// POST /v1/chat/completions are routed to an engine, GET /health answers
// 200 while the router has a healthy worker, and anything else is 404.
//
// Every request gets exactly one answer: the engine's (relayed as it
// streams), or, when no engine could serve it within MaxAttempts, an
// OpenAI-style error object: 400 for a request it cannot route, 413 for a
// body over MaxRequestBytes, 429 when every engine is busy, 502 when the
// tokenizer or the engines failed (or the last engine's own 429/5xx
// answer), 503 when no engine is available. A stream that breaks after its
// first chunk ends with an error event and [DONE].
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/completions", "/v1/chat/completions":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", r.Method+" is not allowed here")
			return
		}
		kind, _ := openai.KindOfPath(r.URL.Path)
		g.route(w, r, kind)
	case "/health":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", r.Method+" is not allowed here")
			return
		}
		g.serveHealth(w)
	default:
		writeError(w, http.StatusNotFound, "not_found_error", "the gateway serves /v1/completions and /v1/chat/completions")
	}
}

// serveHealth answers GET /health: 200 while some engine is healthy or
// degraded, 503 when none is, with the counts of both.
func (g *Gateway) serveHealth(w http.ResponseWriter) {
	healthy, degraded := 0, 0
	for _, ws := range g.r.Stats().Workers {
		switch ws.Health {
		case router.Healthy:
			healthy++
		case router.Degraded:
			degraded++
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if healthy+degraded == 0 {
		// Degraded workers still serve when no healthy one can, so the
		// gateway serves as long as any is left.
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = fmt.Fprintf(w, `{"healthy_workers":%d,"degraded_workers":%d}`+"\n", healthy, degraded)
}

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(errorBody(status, typ, msg))
}

// route serves one completion request: tokenize, choose an engine, relay,
// and move to another engine while nothing has reached the client.
func (g *Gateway) route(w http.ResponseWriter, r *http.Request, kind openai.Kind) {
	g.requests.Add(1)
	ctx := r.Context()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.maxReq))
	if err != nil {
		g.failed.Add(1)
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", err.Error())
			return
		}
		writeError(w, http.StatusBadRequest, "invalid_request_error", "reading the request: "+err.Error())
		return
	}
	req, err := parseRequest(body, kind)
	lora := ""
	if err == nil {
		lora, err = g.adapter(req)
	}
	if err == nil {
		body, err = req.forwardBody(body)
	}
	if err != nil {
		g.failed.Add(1)
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	tokens, mm, err := render.TokenizeAll(ctx, g.tok, req.Request)
	if err != nil {
		if ctx.Err() != nil {
			return // the client is gone: no answer, no failure of ours
		}
		g.failed.Add(1)
		if errors.Is(err, openai.ErrBadRequest) || errors.Is(err, ErrBadRequest) {
			writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		writeError(w, http.StatusBadGateway, "tokenizer_error", err.Error())
		return
	}
	rreq := router.Request{Tokens: tokens, ExpectedOutputTokens: req.MaxTokens, LoRA: lora, CacheSalt: req.CacheSalt, MM: mm}
	if mm == nil {
		req.tokens = tokens
	}

	var (
		tried []kvroute.WorkerKey
		last  *failure
	)
	for i := range g.maxAttempts {
		rreq.Exclude = tried // a retry goes to an engine not tried yet
		d, err := g.r.Select(ctx, &rreq)
		if err == nil && i > 0 {
			g.retries.Add(1)
		}
		if err != nil {
			if ctx.Err() != nil {
				return // the client is gone
			}
			g.failed.Add(1)
			if last != nil {
				last.write(w)
			} else {
				writeSelectError(w, err)
			}
			return
		}
		tried = append(tried, d.Worker)
		f := g.forward(w, r, body, req, d)
		if f == nil || ctx.Err() != nil {
			return
		}
		g.log.Warn("engine attempt failed", "worker", d.Worker.String(), "attempt", i+1, "err", f.err)
		last = f
	}
	g.failed.Add(1)
	last.write(w)
}

// writeSelectError answers a request the router could not place.
func writeSelectError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, scheduling.ErrAllBusy), errors.Is(err, scheduling.ErrQueueFull):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, "rate_limit_error", err.Error())
	default:
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", err.Error())
	}
}

// failure is a failed attempt: what to tell the client if it was the last.
type failure struct {
	worker kvroute.WorkerKey
	err    error
	// status, header and body are the engine's own answer (429 or 5xx),
	// relayed as is; status 0 means the engine gave none, or one the
	// client must not see (a frontend refusing the worker it was asked
	// for).
	status int
	header http.Header
	body   []byte
}

func (f *failure) write(w http.ResponseWriter) {
	w.Header().Set(HeaderWorker, f.worker.String())
	if f.status == 0 {
		writeError(w, http.StatusBadGateway, "engine_error", fmt.Sprintf("engine %s failed: %v", f.worker, f.err))
		return
	}
	for _, name := range relayedFailureHeaders {
		if v := f.header.Values(name); len(v) > 0 {
			w.Header()[name] = v
		}
	}
	w.WriteHeader(f.status)
	_, _ = w.Write(f.body)
}

// relayedFailureHeaders are the headers of an engine's failed answer
// relayed with it: its body's type and when to try again. Its length is
// not (the body kept may be cut short), nor are hop-by-hop headers.
var relayedFailureHeaders = []string{"Content-Type", "Retry-After"}

// statusError is an engine answer the gateway retries elsewhere.
type statusError struct {
	status int
	header http.Header
	body   []byte
	// refused is set when the answer is a frontend refusing the worker
	// the gateway named: the client's request was not at fault, so the
	// client never gets this status.
	refused bool
}

func (e *statusError) Error() string {
	return fmt.Sprintf("engine answered %d %s: %.200s", e.status, http.StatusText(e.status), e.body)
}

// retryable reports whether an engine's status sends the request to
// another engine.
func retryable(status int) bool {
	return status == http.StatusTooManyRequests || status >= 500
}

// attempt is one try of a request on one engine. It is used by the
// request's goroutine only (ReverseProxy calls its hooks synchronously).
type attempt struct {
	g         *Gateway
	ctx       context.Context
	d         *router.Decision
	target    *url.URL
	headers   *engineHeaders
	ranks     int
	rank      kvroute.DPRank // the rank the engine knows the decision's rank by
	stream    bool
	dropUsage bool

	committed   bool  // the engine's answer is being relayed to the client
	clientErr   int   // the status of a relayed 4xx answer: a verdict on the request, none on the engine
	err         error // why the attempt failed, if it did
	engineErr   bool  // the engine reported an error inside its stream
	cached      int
	cachedKnown bool
	finished    bool
}

type attemptKey struct{}

func attemptOf(ctx context.Context) *attempt {
	a, _ := ctx.Value(attemptKey{}).(*attempt)
	return a
}

// forward sends the request to d's engine through the reverse proxy and
// balances d with Done. It returns nil when an answer reached the client,
// and the failure otherwise.
func (g *Gateway) forward(w http.ResponseWriter, in *http.Request, body []byte, req *apiRequest, d *router.Decision) *failure {
	a := &attempt{g: g, d: d, stream: req.Stream, dropUsage: req.injectedUsage}
	g.mu.RLock()
	eng := g.engines[d.Worker.ID]
	g.mu.RUnlock()
	a.rank = d.Worker.Rank
	if eng == nil && g.frontend != nil {
		eng = g.frontend // a worker someone else registered
		if g.frontendDPStart != nil {
			a.rank += kvroute.DPRank(max(g.frontendDPStart(uint64(d.Worker.ID)), 0))
		}
	}
	if eng == nil {
		a.err = fmt.Errorf("%w: %d", ErrEngineGone, d.Worker.ID)
		a.finish(false)
		return &failure{worker: d.Worker, err: a.err}
	}
	a.target, a.headers, a.ranks = eng.target, &eng.headers, max(eng.cfg.Ranks, 1)
	body = req.bodyFor(&eng.headers, body)
	a.ctx = context.WithValue(in.Context(), attemptKey{}, a)
	out := in.Clone(a.ctx)
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	out.ContentLength = int64(len(body))
	out.Header.Del("Content-Length")
	// The body is sent whole with its length: no chunked encoding, and
	// none of the client's trailers, which no header rule filters.
	out.Trailer, out.TransferEncoding = nil, nil

	returned := false
	// Deferred so that Done also runs when the proxy aborts the response
	// (the client went away mid-stream) by panicking with
	// http.ErrAbortHandler.
	defer func() { a.finish(!returned) }()
	g.proxy.ServeHTTP(w, out)
	returned = true
	if a.committed {
		return nil
	}
	if a.err == nil {
		a.err = errors.New("engine gave no answer")
	}
	f := &failure{worker: d.Worker, err: a.err}
	if se, ok := errors.AsType[*statusError](a.err); ok && !se.refused {
		f.status, f.header, f.body = se.status, se.header, se.body
	}
	return f
}

// finish balances the attempt's decision with Done, once. aborted is set
// when the proxy gave up relaying the answer (the client went away
// mid-answer).
func (a *attempt) finish(aborted bool) {
	if a.finished {
		return
	}
	a.finished = true
	// A client that went away before its whole answer was relayed ends
	// the attempt without a verdict. One that leaves once it has it all
	// (closing its connection, which ends the request's context, before
	// this handler returns) does not undo the answer the engine gave.
	gone := a.ctx != nil && a.ctx.Err() != nil
	var o router.Outcome
	switch se, isStatus := errors.AsType[*statusError](a.err); {
	case aborted || gone && (!a.committed || a.err != nil):
		o.Err = context.Canceled
	case isStatus && se.status == http.StatusTooManyRequests:
		// Overloaded, not broken: no verdict on its health.
		o.Err = fmt.Errorf("%w: %w", router.ErrNoVerdict, a.err)
	case a.err != nil:
		o.Err = a.err
	case a.engineErr:
		o.Err = errors.New("gateway: the engine reported an error in its stream")
	case a.clientErr != 0:
		// The engine's verdict on the request, not on itself.
		o.Err = fmt.Errorf("%w: the engine answered %d", router.ErrNoVerdict, a.clientErr)
	default:
		o.CachedTokens, o.CachedTokensKnown = a.cached, a.cachedKnown
	}
	a.d.Done(o)
}

// rewrite points the outbound request at the attempt's engine.
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	a := attemptOf(pr.In.Context())
	pr.SetURL(a.target)
	pr.SetXForwarded()
	// Let the transport negotiate compression and decompress, so that the
	// gateway can read the engine's answer.
	pr.Out.Header.Del("Accept-Encoding")
	// The router chooses the rank, never the client. A rank header of the
	// engine's Headers or Preset replaces vLLM's.
	pr.Out.Header.Del(headerDPRank)
	if a.ranks > 1 && !a.headers.rankHeader {
		pr.Out.Header.Set(headerDPRank, strconv.Itoa(int(a.rank)))
	}
	a.headers.apply(pr.Out.Header, a.d.Worker.ID, a.rank)
}

// proxyError records why an attempt failed; the route loop decides
// whether to retry or answer. Nothing has been written to the client.
func (g *Gateway) proxyError(_ http.ResponseWriter, r *http.Request, err error) {
	if a := attemptOf(r.Context()); a != nil && a.err == nil {
		a.err = err
	}
}

// modifyResponse inspects an engine's answer before it is relayed: it
// turns 429 and 5xx answers and streams that fail before their first
// chunk into errors (so the request moves to another engine), records the
// cached tokens of the usage, and wraps streams to follow them.
func (g *Gateway) modifyResponse(resp *http.Response) error {
	a := attemptOf(resp.Request.Context())
	if retryable(resp.StatusCode) {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return &statusError{status: resp.StatusCode, header: resp.Header.Clone(), body: body}
	}
	if a.headers.refused != nil && resp.StatusCode/100 == 4 {
		// A refusal is a short JSON object: read that much to judge, and
		// relay the rest untouched.
		head, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		if err != nil {
			return fmt.Errorf("reading the engine's answer: %w", err)
		}
		if a.headers.refused(resp.StatusCode, head) {
			return &statusError{status: resp.StatusCode, header: resp.Header.Clone(), body: head, refused: true}
		}
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	}
	resp.Header.Set(HeaderWorker, a.d.Worker.String())
	resp.Header.Set(HeaderPredictedCached, strconv.Itoa(a.d.CachedTokens))
	if resp.StatusCode != http.StatusOK {
		// The engine's verdict on the request (4xx): relay it.
		a.committed = true
		if resp.StatusCode/100 == 4 {
			a.clientErr = resp.StatusCode
		}
		return nil
	}
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct == "text/event-stream" {
		sb := newSSEBody(resp.Body, a, a.dropUsage)
		if err := sb.fill(); err != nil {
			return err
		}
		a.committed = true
		a.d.PrefillDone()
		resp.Body = sb
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, g.maxResp+1))
	if err != nil {
		return fmt.Errorf("reading the engine's answer: %w", err)
	}
	if int64(len(body)) > g.maxResp {
		// The engine did its work; the answer is only too large to relay.
		// Another engine would give as large a one: answer the client
		// with an error, not retried and not held against the engine,
		// which served the request (its Done is a success).
		_ = resp.Body.Close()
		msg := errorBody(http.StatusBadGateway, "engine_error", fmt.Sprintf("the engine's answer exceeds %d bytes", g.maxResp))
		a.committed = true
		resp.StatusCode, resp.Status = http.StatusBadGateway, "502 Bad Gateway"
		resp.Body = io.NopCloser(bytes.NewReader(msg))
		resp.ContentLength = int64(len(msg))
		resp.Header = http.Header{"Content-Type": {"application/json"}, "Content-Length": {strconv.Itoa(len(msg))}}
		resp.Header.Set(HeaderWorker, a.d.Worker.String())
		return nil
	}
	if u, ok := openai.ParseUsage(body); ok && u.CachedKnown {
		a.cached, a.cachedKnown = u.CachedTokens, true
	}
	a.committed = true
	a.d.PrefillDone()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return nil
}

// chunk implements streamHooks.
func (a *attempt) chunk(ev *openai.Event) {
	if ev.HasChoices {
		a.d.AddOutputTokens(1)
	}
	if ev.HasUsage && ev.Usage.CachedKnown {
		a.cached, a.cachedKnown = ev.Usage.CachedTokens, true
	}
	if ev.Error {
		a.engineErr = true
	}
}

// failed implements streamHooks: before the first chunk the error fails
// the attempt (and the request moves on); after it, the client gets an
// error event in place of the rest of the stream.
func (a *attempt) failed(err error) []byte {
	if a.err == nil {
		a.err = err
	}
	if !a.committed || a.ctx.Err() != nil {
		return nil
	}
	return errorEvent(http.StatusBadGateway, "engine_error",
		fmt.Sprintf("engine %s failed mid-stream: %v", a.d.Worker, err))
}
