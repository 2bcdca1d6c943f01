package epp_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/epp"
	"github.com/kvroute/kvroute/internal/fakeengine"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/zmq"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/render"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

const blockSize = 16

// cluster is a picker serving ext_proc on a real gRPC server on loopback,
// in front of fake engines whose KV events feed the router's index.
type cluster struct {
	t       *testing.T
	r       *router.Router
	eps     *epp.Endpoints
	srv     *epp.Server
	addr    string // the picker's gRPC address
	conn    *grpc.ClientConn
	client  extprocv3.ExternalProcessorClient
	engines []*fakeengine.Engine
	subs    []*zmq.Subscriber
}

type clusterOpts struct {
	engines  int
	adapters []string      // served by every engine
	delay    time.Duration // between an engine's streamed chunks
	// tokenizer, when set, makes the picker's tokenizer from the engines.
	tokenizer func(engines []*fakeengine.Engine) epp.Tokenizer
	cfg       epp.Config    // Router, Endpoints, Tokenizer are filled in
	router    router.Config // Hasher is filled in
}

func newCluster(t *testing.T, o clusterOpts) *cluster {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	o.router.Hasher = kvroute.MustHasher(kvroute.HasherConfig{BlockSize: blockSize})
	r, err := router.New(o.router)
	require.NoError(t, err)
	c := &cluster{t: t, r: r, eps: &epp.Endpoints{}}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	for i := range o.engines {
		e, err := fakeengine.Start(fakeengine.Config{ID: kvroute.WorkerID(i + 1), BlockSize: blockSize, Capacity: 4096, Chunks: 3, Delay: o.delay, Adapters: o.adapters})
		require.NoError(t, err)
		t.Cleanup(e.Close)
		c.engines = append(c.engines, e)
		require.NoError(t, r.AddWorker(router.StaticWorker{WorkerID: e.ID(), Block: blockSize}))
		require.NoError(t, c.eps.Set(kvroute.WorkerKey{ID: e.ID()}, e.Addr()))
		sub, err := zmq.New(zmq.Config{Endpoint: e.Events(), ReplayEndpoint: e.Replay(), Topic: fakeengine.Topic,
			Converter: kvevents.ConverterConfig{Worker: e.ID(), BlockSize: blockSize}, Sink: r.Index(),
			IdleTimeout: 500 * time.Millisecond})
		require.NoError(t, err)
		c.subs = append(c.subs, sub)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = sub.Run(ctx)
		}()
	}
	// Ping each engine until its subscriber hears it, so that no batch of
	// the test is published before the subscription.
	for i, e := range c.engines {
		require.Eventually(t, func() bool {
			require.NoError(t, e.Ping())
			return c.subs[i].Stats().Received > 0
		}, 10*time.Second, 20*time.Millisecond)
	}
	o.cfg.Router, o.cfg.Endpoints = r, c.eps
	switch {
	case o.tokenizer != nil:
		o.cfg.Tokenizer = o.tokenizer(c.engines)
	case o.cfg.Tokenizer == nil:
		o.cfg.Tokenizer = epp.TokenizerFunc(fakeengine.Words)
	}
	c.srv, err = epp.New(o.cfg)
	require.NoError(t, err)
	g := grpc.NewServer()
	c.srv.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c.addr = ln.Addr().String()
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	c.conn, err = grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.conn.Close() })
	c.client = extprocv3.NewExternalProcessorClient(c.conn)
	return c
}

// sendCompletion opens an ext_proc stream and sends it the request
// headers of a POST to /v1/completions and body, whole; the caller reads
// the picker's answers.
func (c *cluster) sendCompletion(ctx context.Context, body string) extprocv3.ExternalProcessor_ProcessClient {
	c.t.Helper()
	stream, err := c.client.Process(ctx)
	require.NoError(c.t, err)
	require.NoError(c.t, stream.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				header(":method", "POST"), header(":path", "/v1/completions"), header("content-type", "application/json"),
			}},
		}},
		ProtocolConfig: protocolConfig(""),
	}))
	require.NoError(c.t, stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}}))
	return stream
}

// engineAt returns the engine serving addr.
func (c *cluster) engineAt(addr string) *fakeengine.Engine {
	for _, e := range c.engines {
		if e.Addr() == addr {
			return e
		}
	}
	c.t.Fatalf("no engine at %q", addr)
	return nil
}

// waitEvents waits until every event the engines published is applied.
func (c *cluster) waitEvents() {
	c.t.Helper()
	require.Eventually(c.t, func() bool {
		for i, e := range c.engines {
			if c.subs[i].Stats().Applied < uint64(e.Published()) {
				return false
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond, "events not applied: %v", c.eventStats())
}

func (c *cluster) eventStats() string {
	var b strings.Builder
	for i, e := range c.engines {
		fmt.Fprintf(&b, "engine %d published %d, subscriber %+v; ", e.ID(), e.Published(), c.subs[i].Stats())
	}
	return b.String()
}

// balanced checks that every Select was balanced by one Done.
func (c *cluster) balanced() {
	c.t.Helper()
	require.Eventually(c.t, func() bool {
		st := c.r.Stats()
		return st.Decisions == st.Outcomes && st.TrackedRequests == 0
	}, 5*time.Second, 5*time.Millisecond, "decisions not balanced: %+v", c.r.Stats())
}

// exchange is what the data plane saw of one request.
type exchange struct {
	endpoints []string // from the header
	metadata  string   // from dynamic_metadata
	immediate int      // immediate response status, 0 if none
	errBody   string
	status    int    // the engine's status
	body      string // the response body as the client sees it
	served    string // the engine that served
}

// envoyOpts shape one simulated request.
type envoyOpts struct {
	path   string
	body   string
	subset []string // subset hint, nil for none
	served func(list []string) string
	// servedAs is how the served endpoint is reported: "" in the envoy.lb
	// metadata, "attribute" as Envoy's upstream.address attribute, "none"
	// not at all.
	servedAs string
	// cancelAt is where the stream ends early: "after-route" and
	// "mid-response" cancel it, "close-mid-response" and
	// "close-after-response-headers" half-close it.
	cancelAt string
	// responseBodyMode is the response body mode the first message's
	// protocol configuration announces, as Envoy 1.33 and later send it;
	// "" sends FULL_DUPLEX_STREAMED, "absent" no configuration.
	responseBodyMode string
	chunk            int // request body chunk size
	noTrailer        bool
}

// protocolConfig returns the protocol configuration whose response body
// mode is mode (see envoyOpts.responseBodyMode).
func protocolConfig(mode string) *extprocv3.ProtocolConfiguration {
	switch mode {
	case "absent":
		return nil
	case "":
		mode = "FULL_DUPLEX_STREAMED"
	}
	return &extprocv3.ProtocolConfiguration{
		RequestBodyMode:  extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode: extprocfilterv3.ProcessingMode_BodySendMode(extprocfilterv3.ProcessingMode_BodySendMode_value[mode]),
	}
}

func header(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

// do plays Envoy's part of one HTTP request in FULL_DUPLEX_STREAMED mode:
// request headers, the body in chunks, then (once the picker answered)
// sends the request to the first endpoint, relays the response headers
// with the served endpoint in the metadata, the response body chunk by
// chunk, and closes the stream.
func (c *cluster) do(o envoyOpts) exchange {
	c.t.Helper()
	t := c.t
	if o.path == "" {
		o.path = "/v1/completions"
	}
	if o.chunk == 0 {
		o.chunk = 17
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := c.client.Process(ctx)
	require.NoError(t, err)
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	if o.subset != nil {
		vals := make([]any, len(o.subset))
		for i, s := range o.subset {
			vals[i] = s
		}
		st, err := structpb.NewStruct(map[string]any{epp.KeySubset: vals})
		require.NoError(t, err)
		md.FilterMetadata[epp.NamespaceSubset] = st
	}
	require.NoError(t, stream.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				header(":method", "POST"), header(":path", o.path), header(":authority", "gw"),
				header("content-type", "application/json"), header("x-request-id", "req-1"),
			}},
			EndOfStream: o.body == "",
		}},
		MetadataContext: md,
		ProtocolConfig:  protocolConfig(o.responseBodyMode),
	}))
	body := []byte(o.body)
	for len(body) > 0 {
		n := min(o.chunk, len(body))
		err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body[:n], EndOfStream: n == len(body)}}})
		if err == io.EOF {
			break // the picker answered early; Recv tells how
		}
		require.NoError(t, err)
		body = body[n:]
	}
	var ex exchange
	// The picker answers the headers, then streams the body back.
	first, err := stream.Recv()
	require.NoError(t, err)
	if ir := first.GetImmediateResponse(); ir != nil {
		ex.immediate, ex.errBody = int(ir.GetStatus().GetCode()), string(ir.GetBody())
		_, err := stream.Recv()
		require.ErrorIs(t, err, io.EOF, "the picker ends the stream after an immediate response")
		return ex
	}
	hr := first.GetRequestHeaders()
	require.NotNil(t, hr, "first answer: %v", first)
	for _, h := range hr.GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == epp.HeaderDestination {
			ex.endpoints = strings.Split(string(h.GetHeader().GetRawValue()), ",")
		}
	}
	ex.metadata = first.GetDynamicMetadata().GetFields()[epp.NamespaceLB].GetStructValue().GetFields()[epp.HeaderDestination].GetStringValue()
	require.NotEmpty(t, ex.endpoints)
	var fwd []byte
	if o.body != "" {
		for {
			m, err := stream.Recv()
			require.NoError(t, err)
			sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			require.NotNil(t, sr, "body answer: %v", m)
			fwd = append(fwd, sr.GetBody()...)
			if sr.GetEndOfStream() {
				break
			}
		}
	}
	if o.cancelAt == "after-route" {
		cancel()
		return ex
	}
	// Send the request to the first endpoint, or the one served picks.
	ex.served = ex.endpoints[0]
	if o.served != nil {
		ex.served = o.served(ex.endpoints)
	}
	resp, err := http.Post("http://"+ex.served+o.path, "application/json", bytes.NewReader(fwd))
	require.NoError(t, err)
	defer resp.Body.Close()
	ex.status = resp.StatusCode
	rh := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				header(":status", strconv.Itoa(resp.StatusCode)), header("content-type", resp.Header.Get("Content-Type")),
			}},
		}},
	}
	switch o.servedAs {
	case "":
		servedMD, err := structpb.NewStruct(map[string]any{epp.KeyServed: ex.served})
		require.NoError(t, err)
		rh.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.NamespaceLB: servedMD}}
	case "attribute":
		attrs, err := structpb.NewStruct(map[string]any{epp.AttributeUpstream: ex.served})
		require.NoError(t, err)
		rh.Attributes = map[string]*structpb.Struct{epp.AttributesExtProc: attrs}
	}
	require.NoError(t, stream.Send(rh))
	m, err := stream.Recv()
	require.NoError(t, err)
	require.NotNil(t, m.GetResponseHeaders(), "response headers answer: %v", m)
	if o.cancelAt == "close-after-response-headers" {
		// The client went away before the first body chunk, or Envoy
		// sends the picker no body: Envoy half-closes the stream.
		require.NoError(t, stream.CloseSend())
		_, err := stream.Recv()
		require.ErrorIs(t, err, io.EOF)
		return ex
	}
	buf := make([]byte, 23)
	var out []byte
	sent := 0
	for {
		n, rerr := resp.Body.Read(buf)
		if rerr != nil && rerr != io.EOF {
			require.NoError(t, rerr)
		}
		eos := rerr == io.EOF
		if n == 0 && !eos {
			continue
		}
		require.NoError(t, stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: bytes.Clone(buf[:n]), EndOfStream: eos}}}))
		sent++
		if o.cancelAt == "mid-response" && sent == 2 {
			cancel()
			return ex
		}
		if o.cancelAt == "close-mid-response" && sent == 2 {
			// Envoy half-closes the stream when the client goes away.
			require.NoError(t, stream.CloseSend())
			for {
				if _, err := stream.Recv(); err != nil {
					require.ErrorIs(t, err, io.EOF)
					return ex
				}
			}
		}
		for {
			m, err := stream.Recv()
			require.NoError(t, err)
			sr := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			require.NotNil(t, sr, "response body answer: %v", m)
			out = append(out, sr.GetBody()...)
			if sr.GetEndOfStream() || !eos {
				break
			}
		}
		if eos {
			break
		}
	}
	ex.body = string(out)
	require.NoError(t, stream.CloseSend())
	_, err = stream.Recv()
	require.ErrorIs(t, err, io.EOF)
	return ex
}

// prompt is a completion body whose text starts with group's shared
// prefix of 64 words.
func prompt(group, i int, stream bool) string {
	var b strings.Builder
	for w := range 64 {
		fmt.Fprintf(&b, "g%dw%d ", group, w)
	}
	fmt.Fprintf(&b, "question %d of group %d", i, group)
	return fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":4,"stream":%t}`, b.String(), stream)
}

func TestSharedPrefixGoesToItsEngine(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 3, cfg: epp.Config{InjectUsage: true}})
	c.srv.SetReady(true)
	home := map[int]string{}
	for round := range 4 {
		for g := range 3 {
			ex := c.do(envoyOpts{body: prompt(g, round, round%2 == 1)})
			require.Zero(t, ex.immediate, ex.errBody)
			require.Equal(t, 200, ex.status)
			require.Len(t, ex.endpoints, 3, "the pick and two fallbacks")
			require.Equal(t, strings.Join(ex.endpoints, ","), ex.metadata, "header and metadata agree")
			if round == 0 {
				home[g] = ex.endpoints[0]
			} else {
				require.Equal(t, home[g], ex.endpoints[0], "group %d round %d left the engine holding its prefix", g, round)
			}
			c.waitEvents()
		}
	}
	c.balanced()
	st := c.srv.Stats()
	require.EqualValues(t, 12, st.Routed)
	require.EqualValues(t, 12, st.Completed)
	// Rounds 1 to 3 find the 64-word prefix (4 blocks) cached, as predicted.
	require.EqualValues(t, 9*64, st.PredictedCachedTokens)
	require.EqualValues(t, 9*64, st.ActualCachedTokens)
	require.EqualValues(t, 9*4, st.ActualCachedBlocks)
	rs := c.r.Stats()
	require.EqualValues(t, 9*64, rs.ActualCachedTokens, "Done carried the engines' cached tokens")
}

func TestStreamUsageInjected(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 2, cfg: epp.Config{InjectUsage: true}})
	for i := range 2 {
		ex := c.do(envoyOpts{path: "/v1/chat/completions",
			body: `{"model":"m","stream":true,"messages":[{"role":"system","content":"you are a helpful assistant with a long system prompt that spans blocks one two three four five six seven"},{"role":"user","content":[{"type":"text","text":"hello there ` + strconv.Itoa(i) + `"}]}]}`})
		require.Equal(t, 200, ex.status)
		require.Contains(t, ex.body, "data: [DONE]")
		require.Contains(t, ex.body, `"t2 "`)
		require.NotContains(t, ex.body, "usage", "the usage chunk the picker asked for is removed")
		c.waitEvents()
	}
	c.balanced()
	st := c.srv.Stats()
	require.EqualValues(t, 2, st.Completed)
	require.EqualValues(t, 16, st.ActualCachedTokens, "the second request found the system prompt's block")
}

func TestStatusCodes(t *testing.T) {
	tests := []struct {
		name   string
		opts   clusterOpts
		prep   func(c *cluster)
		req    envoyOpts
		want   int
		reason string
	}{
		{name: "malformed body", opts: clusterOpts{engines: 1}, req: envoyOpts{body: `{"model":`}, want: 400, reason: "body is not a JSON object"},
		{name: "batch prompt", opts: clusterOpts{engines: 1}, req: envoyOpts{body: `{"prompt":["a","b"]}`}, want: 400, reason: "batches are not routed"},
		{name: "chat without messages", opts: clusterOpts{engines: 1}, req: envoyOpts{path: "/v1/chat/completions", body: `{"model":"m"}`}, want: 400, reason: "no messages"},
		{name: "too large", opts: clusterOpts{engines: 1, cfg: epp.Config{MaxBodyBytes: 64}}, req: envoyOpts{body: prompt(0, 0, false)}, want: 413, reason: "larger than 64 bytes"},
		{name: "no endpoints", opts: clusterOpts{engines: 0}, req: envoyOpts{body: prompt(0, 0, false)}, want: 503, reason: "no eligible endpoint"},
		{name: "worker without address", opts: clusterOpts{engines: 1}, prep: func(c *cluster) { c.eps.DeleteWorker(1) },
			req: envoyOpts{body: prompt(0, 0, false)}, want: 503, reason: "no eligible endpoint"},
		{name: "subset of unknown endpoints", opts: clusterOpts{engines: 2}, req: envoyOpts{body: prompt(0, 0, false), subset: []string{"10.9.9.9:8000"}}, want: 503, reason: "no eligible endpoint"},
		{name: "empty subset", opts: clusterOpts{engines: 2}, req: envoyOpts{body: prompt(0, 0, false), subset: []string{}}, want: 503, reason: "no eligible endpoint"},
		{name: "all busy", opts: clusterOpts{engines: 1, router: router.Config{Busy: scheduling.BusyThresholds{MaxPrefillTokens: 1}}},
			prep: func(c *cluster) {
				d, err := c.r.Select(context.Background(), &router.Request{Tokens: make([]uint32, 40)})
				require.NoError(c.t, err)
				c.t.Cleanup(func() { d.Done(router.Outcome{}) })
			},
			req: envoyOpts{body: prompt(0, 0, false)}, want: 429, reason: "busy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, tt.opts)
			if tt.prep != nil {
				tt.prep(c)
			}
			ex := c.do(tt.req)
			require.Equal(t, tt.want, ex.immediate)
			require.Contains(t, ex.errBody, tt.reason)
			require.Contains(t, ex.errBody, `"error"`)
		})
	}
}

func TestSubsetHint(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 3})
	// Warm engine 1 with the prefix; the subset still forces engine 3.
	ex := c.do(envoyOpts{body: prompt(0, 0, false), subset: []string{c.engines[0].Addr()}})
	require.Equal(t, []string{c.engines[0].Addr()}, ex.endpoints)
	c.waitEvents()
	ex = c.do(envoyOpts{body: prompt(0, 1, false), subset: []string{c.engines[2].Addr(), "10.1.1.1:80"}})
	require.Equal(t, []string{c.engines[2].Addr()}, ex.endpoints, "only subset members are listed")
	ex = c.do(envoyOpts{body: prompt(0, 2, false), subset: []string{c.engines[1].Addr(), c.engines[0].Addr()}})
	require.Equal(t, []string{c.engines[0].Addr(), c.engines[1].Addr()}, ex.endpoints, "the cached engine first")
	c.balanced()
}

func TestDoneOnErrorCancelAndFallback(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 3})
	// The engine answers 503: Done with an error.
	for _, e := range c.engines {
		e.FailNext(1)
	}
	ex := c.do(envoyOpts{body: prompt(1, 0, false)})
	require.Equal(t, 503, ex.status)
	c.balanced()
	require.EqualValues(t, 1, c.r.Stats().Failures)
	require.EqualValues(t, 1, c.srv.Stats().EngineErrors)
	for _, e := range c.engines {
		e.FailNext(0)
	}

	// The client goes away after the pick, and in the middle of a stream.
	c.do(envoyOpts{body: prompt(2, 0, false), cancelAt: "after-route"})
	c.balanced()
	c.do(envoyOpts{body: prompt(2, 1, true), cancelAt: "mid-response"})
	c.balanced()
	c.do(envoyOpts{body: prompt(2, 2, true), cancelAt: "close-mid-response"})
	c.balanced()
	require.EqualValues(t, 3, c.srv.Stats().Canceled)
	require.EqualValues(t, 1, c.srv.Stats().Completed, "only the engine's 503 completed")
	require.EqualValues(t, 1, c.r.Stats().Failures, "cancellations are not the engines' fault")

	// Envoy serves on the second endpoint of the list.
	before := map[string]int64{}
	for _, e := range c.engines {
		before[e.Addr()] = e.Requests()
	}
	ex = c.do(envoyOpts{body: prompt(3, 0, false), served: func(l []string) string { return l[1] }})
	require.Equal(t, 200, ex.status)
	require.EqualValues(t, 1, c.engineAt(ex.endpoints[1]).Requests()-before[ex.endpoints[1]])
	require.Zero(t, c.engineAt(ex.endpoints[0]).Requests()-before[ex.endpoints[0]])
	c.balanced()
	st := c.srv.Stats()
	require.EqualValues(t, 1, st.ServedElsewhere)
	rs := c.r.Stats()
	require.EqualValues(t, 2, rs.Failures, "the endpoint that was skipped failed")
	var servedDecisions uint64
	for _, w := range rs.Workers {
		if addr, _ := c.eps.Address(w.Worker); addr == ex.served {
			servedDecisions = w.Decisions
		}
	}
	require.NotZero(t, servedDecisions, "the request was tracked on the endpoint that served it")
}

// TestCloseAfterResponseHeaders ends streams right after the response
// headers: a cancellation when Envoy was to send the picker the response
// body (the client went away before its first chunk), a success when it
// sends none.
func TestCloseAfterResponseHeaders(t *testing.T) {
	tests := []struct {
		mode     string
		canceled bool
	}{
		{mode: "", canceled: true},
		{mode: "STREAMED", canceled: true},
		{mode: "NONE", canceled: false},
		{mode: "absent", canceled: false},
	}
	for _, tt := range tests {
		t.Run(cmp.Or(tt.mode, "FULL_DUPLEX_STREAMED"), func(t *testing.T) {
			c := newCluster(t, clusterOpts{engines: 2})
			ex := c.do(envoyOpts{body: prompt(4, 0, true), cancelAt: "close-after-response-headers", responseBodyMode: tt.mode})
			require.Equal(t, 200, ex.status)
			c.balanced()
			st := c.srv.Stats()
			if tt.canceled {
				require.EqualValues(t, 1, st.Canceled)
				require.Zero(t, st.Completed)
			} else {
				require.EqualValues(t, 1, st.Completed)
				require.Zero(t, st.Canceled)
			}
			require.Zero(t, c.r.Stats().Failures, "neither counts against the engine")
		})
	}
}

func TestRequestWithoutBody(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := c.client.Process(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true, Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			header(":method", "GET"), header(":path", "/v1/models")}}}}}))
	m, err := stream.Recv()
	require.NoError(t, err)
	require.NotNil(t, m.GetRequestHeaders())
	require.NotEmpty(t, m.GetDynamicMetadata().GetFields()[epp.NamespaceLB].GetStructValue().GetFields()[epp.HeaderDestination].GetStringValue())
	require.NoError(t, stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{EndOfStream: true, Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			header(":status", "200")}}}}}))
	m, err = stream.Recv()
	require.NoError(t, err)
	require.NotNil(t, m.GetResponseHeaders())
	require.NoError(t, stream.CloseSend())
	_, err = stream.Recv()
	require.ErrorIs(t, err, io.EOF)
	c.balanced()
	require.EqualValues(t, 1, c.srv.Stats().Completed)
}

func TestHealth(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 1})
	h := healthpb.NewHealthClient(c.conn)
	ctx := context.Background()
	check := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		require.NoError(t, err)
		return resp.GetStatus()
	}
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, check(epp.ServiceLiveness))
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, check(epp.ServiceReadiness))
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, check(extprocv3.ExternalProcessor_ServiceDesc.ServiceName))
	c.srv.SetReady(true)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, check(epp.ServiceReadiness))
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, check(""))
}

func TestAdaptersAndCacheSalt(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 2, adapters: []string{"support-lora"},
		cfg: epp.Config{Adapters: map[string]string{"support": "support-lora"}}})
	body := func(model, salt string) string {
		var b strings.Builder
		for w := range 40 {
			fmt.Fprintf(&b, "w%d ", w)
		}
		return fmt.Sprintf(`{"model":%q,"prompt":%q,"cache_salt":%q}`, model, b.String(), salt)
	}
	tests := []struct {
		name, model, salt string
		cached            int // predicted and found
	}{
		{"adapter, first", "support", "", 0},
		{"adapter again", "support", "", 32},
		{"adapter by its own name", "support-lora", "", 32},
		{"base model", "m", "", 0},
		{"base model again", "m", "", 32},
		{"salted", "m", "tenant-a", 0},
		{"salted again", "m", "tenant-a", 32},
		{"another salt", "m", "tenant-b", 0},
	}
	for _, tt := range tests {
		before := c.srv.Stats()
		ex := c.do(envoyOpts{body: body(tt.model, tt.salt)})
		require.Equal(t, 200, ex.status, tt.name)
		c.waitEvents()
		after := c.srv.Stats()
		require.EqualValues(t, tt.cached, after.PredictedCachedTokens-before.PredictedCachedTokens, tt.name)
		require.EqualValues(t, tt.cached, after.ActualCachedTokens-before.ActualCachedTokens, tt.name)
	}
	c.balanced()
}

func TestAgenticChatNeedsTheEnginesTemplate(t *testing.T) {
	chat := func(turn int) string {
		return `{"model":"m","tools":[{"type":"function","function":{"name":"search","description":"search the web for pages about a topic and return the ten best","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}],` +
			`"messages":[{"role":"system","content":"you are an agent that plans, calls tools and answers briefly"},{"role":"user","content":"turn ` + strconv.Itoa(turn) + `"}]}`
	}
	for _, tt := range []struct {
		name      string
		renderer  bool
		predicted bool
	}{
		{"text-only tokenizer misses", false, false},
		{"renderer finds the prefix", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := clusterOpts{engines: 2}
			if tt.renderer {
				o.tokenizer = func(es []*fakeengine.Engine) epp.Tokenizer { return &render.Client{URL: es[0].URL()} }
			}
			c := newCluster(t, o)
			for turn := range 3 {
				ex := c.do(envoyOpts{path: "/v1/chat/completions", body: chat(turn)})
				require.Equal(t, 200, ex.status)
				c.waitEvents()
			}
			c.balanced()
			st := c.srv.Stats()
			require.NotZero(t, st.ActualCachedTokens, "the engines reuse the tools and system prompt")
			if tt.predicted {
				require.Equal(t, st.ActualCachedTokens, st.PredictedCachedTokens)
			} else {
				require.Zero(t, st.PredictedCachedTokens, "tools dropped: the ids match nothing the engines cached")
			}
		})
	}
}

func TestImagesAreHashedIntoBlocks(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 2,
		tokenizer: func(es []*fakeengine.Engine) epp.Tokenizer { return &render.Client{URL: es[0].URL()} }})
	var sys strings.Builder
	for w := range 20 {
		fmt.Fprintf(&sys, "s%d ", w)
	}
	chat := func(image string) string {
		return `{"model":"m","messages":[{"role":"system","content":"` + sys.String() + `"},` +
			`{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + image + `"}},{"type":"text","text":"describe this picture in words one two three four five six seven eight nine ten"}]}]}`
	}
	// system role token + 20 words = 21 tokens: block 0 (16) is text only;
	// the image's 4 tokens start at 22, in block 1.
	tests := []struct {
		image  string
		cached int
	}{
		{"https://example.invalid/a.png", 0},
		{"https://example.invalid/a.png", 32}, // blocks 0 and 1: the same image
		{"https://example.invalid/b.png", 16}, // another image: only block 0
	}
	for i, tt := range tests {
		before := c.srv.Stats()
		ex := c.do(envoyOpts{path: "/v1/chat/completions", body: chat(tt.image), subset: []string{c.engines[0].Addr()}})
		require.Equal(t, 200, ex.status, i)
		c.waitEvents()
		after := c.srv.Stats()
		require.EqualValues(t, tt.cached, after.ActualCachedTokens-before.ActualCachedTokens, "request %d: the engine's cache", i)
		require.EqualValues(t, tt.cached, after.PredictedCachedTokens-before.PredictedCachedTokens, "request %d: the prediction", i)
	}
	c.balanced()
}

// unhealthy returns the addresses of the workers the router judges
// unhealthy. With router.HealthConfig{DegradedErrors: 1, UnhealthyErrors: 1}
// they are the endpoints whose last outcome was a failure.
func (c *cluster) unhealthy() []string {
	var out []string
	for _, w := range c.r.Stats().Workers {
		if w.Health != router.Unhealthy {
			continue
		}
		addr, ok := c.eps.Address(w.Worker)
		require.True(c.t, ok, "worker %s has an endpoint", w.Worker)
		out = append(out, addr)
	}
	slices.Sort(out)
	return out
}

// oneErrorUnhealthy makes every failed outcome show in a worker's health.
var oneErrorUnhealthy = router.Config{Health: router.HealthConfig{DegradedErrors: 1, UnhealthyErrors: 1}}

// TestNoVerdictStatuses: an engine's 429 (overloaded) and other 4xx
// answers (the request refused) say nothing of its health: they neither
// count against the engine, as a 5xx does, nor clear its errors, as a
// success does.
func TestNoVerdictStatuses(t *testing.T) {
	for _, status := range []int{429, 400, 404, 422} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			c := newCluster(t, clusterOpts{engines: 2, router: router.Config{Health: router.HealthConfig{DegradedErrors: 1, UnhealthyErrors: 100}}})
			addr := c.engines[0].Addr()
			health := func() router.Health {
				h, ok := c.r.Health(kvroute.WorkerKey{ID: c.engines[0].ID()})
				require.True(t, ok)
				return h
			}
			c.engines[0].FailNextWith(1, 503)
			ex := c.do(envoyOpts{body: prompt(0, 0, false), subset: []string{addr}})
			require.Equal(t, 503, ex.status)
			c.balanced()
			require.EqualValues(t, 1, c.r.Stats().Failures)
			require.Equal(t, router.Degraded, health())

			c.engines[0].FailNextWith(1, status)
			ex = c.do(envoyOpts{body: prompt(0, 1, false), subset: []string{addr}})
			require.Equal(t, status, ex.status)
			c.balanced()
			require.EqualValues(t, 1, c.r.Stats().Failures, "no failure of the engine")
			require.Equal(t, router.Degraded, health(), "its errors are not cleared")
			require.EqualValues(t, 2, c.srv.Stats().Completed)

			ex = c.do(envoyOpts{body: prompt(0, 2, false), subset: []string{addr}})
			require.Equal(t, 200, ex.status)
			c.balanced()
			require.Equal(t, router.Healthy, health(), "a success clears them")
		})
	}
}

func TestServedEndpointReport(t *testing.T) {
	tests := []struct {
		name     string
		servedAs string
		fail     bool // the endpoint that serves answers 503
		// Which endpoints of the list end unhealthy (failed), by index.
		wantFailed      []int
		servedElsewhere uint64
	}{
		{name: "metadata, fallback succeeds", wantFailed: []int{0}, servedElsewhere: 1},
		{name: "attribute, fallback succeeds", servedAs: "attribute", wantFailed: []int{0}, servedElsewhere: 1},
		{name: "attribute, fallback fails", servedAs: "attribute", fail: true, wantFailed: []int{0, 1}, servedElsewhere: 1},
		// Without a report the outcome counts on the pick.
		{name: "no report, fallback succeeds", servedAs: "none"},
		{name: "no report, fallback fails", servedAs: "none", fail: true, wantFailed: []int{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, clusterOpts{engines: 3, router: oneErrorUnhealthy})
			ex := c.do(envoyOpts{body: prompt(0, 0, false), servedAs: tt.servedAs, served: func(l []string) string {
				if tt.fail {
					c.engineAt(l[1]).FailNext(1)
				}
				return l[1]
			}})
			require.Len(t, ex.endpoints, 3)
			require.Equal(t, ex.endpoints[1], ex.served)
			c.balanced()
			var want []string
			for _, i := range tt.wantFailed {
				want = append(want, ex.endpoints[i])
			}
			slices.Sort(want)
			require.Equal(t, want, c.unhealthy(), "the endpoints whose outcome failed")
			require.EqualValues(t, len(tt.wantFailed), c.r.Stats().Failures)
			require.Equal(t, tt.servedElsewhere, c.srv.Stats().ServedElsewhere)
		})
	}
}

func TestPrefillDoneOnFirstResponseChunk(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := c.client.Process(ctx)
	require.NoError(t, err)
	send := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		t.Helper()
		require.NoError(t, stream.Send(req))
		resp, err := stream.Recv()
		require.NoError(t, err)
		return resp
	}
	load := func() scheduling.WorkerLoad {
		t.Helper()
		ws := c.r.Stats().Workers
		require.Len(t, ws, 1)
		return ws[0].Tracked
	}
	require.NoError(t, stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{header(":method", "POST"), header(":path", "/v1/completions")}}}}}))
	require.NotNil(t, send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
		Body: []byte(prompt(0, 0, true)), EndOfStream: true}}}).GetRequestHeaders())
	_, err = stream.Recv() // the body, relayed
	require.NoError(t, err)
	picked := load()
	require.Equal(t, 1, picked.ActiveRequests)
	require.Positive(t, picked.ActivePrefillTokens, "the prompt is tracked as prefill until the first response chunk")

	require.NotNil(t, send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{header(":status", "200"), header("content-type", "text/event-stream")}}}}}).GetResponseHeaders())
	require.Equal(t, picked, load(), "response headers do not end the prefill")

	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
		Body: []byte("data: {\"choices\":[{\"text\":\"t0 \"}]}\n\n")}}})
	decoding := load()
	require.Equal(t, 1, decoding.ActiveRequests, "the request is still active")
	require.Zero(t, decoding.ActivePrefillTokens, "the first response chunk ended the prefill")

	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
		Body: []byte("data: [DONE]\n\n"), EndOfStream: true}}})
	require.NoError(t, stream.CloseSend())
	_, err = stream.Recv()
	require.ErrorIs(t, err, io.EOF)
	c.balanced()
	require.EqualValues(t, 1, c.srv.Stats().Completed)
}

// A response that ends with trailers, its last body chunk not marked as
// the end: the picker relays all of the body before the trailers (the end
// of a stream it scans included) and reads a JSON body's usage.
func TestResponseTrailersEndTheBody(t *testing.T) {
	const streamed = "data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: [DONE]" // no blank line after the last event
	const usage = `{"choices":[{"text":"x"}],"usage":{"prompt_tokens":40,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":32}}}`
	tests := []struct {
		name, contentType, body, request string
		inject                           bool
		wantCached                       uint64
	}{
		{name: "a stream with the usage chunk the picker removes", contentType: "text/event-stream", body: streamed,
			request: `{"model":"m","prompt":"hello","stream":true}`, inject: true},
		{name: "a JSON body", contentType: "application/json", body: usage, request: `{"model":"m","prompt":"hello"}`, wantCached: 32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, clusterOpts{engines: 1, cfg: epp.Config{InjectUsage: tt.inject}})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stream := c.sendCompletion(ctx, tt.request)
			first, err := stream.Recv()
			require.NoError(t, err)
			require.NotNil(t, first.GetRequestHeaders(), "first answer: %v", first)
			for {
				m, err := stream.Recv()
				require.NoError(t, err)
				if m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
					break
				}
			}
			require.NoError(t, stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
				ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
					header(":status", "200"), header("content-type", tt.contentType),
				}}}}}))
			m, err := stream.Recv()
			require.NoError(t, err)
			require.NotNil(t, m.GetResponseHeaders())
			require.NoError(t, stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: []byte(tt.body)}}}))
			var got []byte
			m, err = stream.Recv()
			require.NoError(t, err)
			got = append(got, m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
			require.NoError(t, stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
				ResponseTrailers: &extprocv3.HttpTrailers{}}}))
			for {
				m, err := stream.Recv()
				require.NoError(t, err)
				if m.GetResponseTrailers() != nil {
					break
				}
				sr := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
				require.NotNil(t, sr, "answer: %v", m)
				require.False(t, sr.GetEndOfStream(), "the trailers end the response")
				got = append(got, sr.GetBody()...)
			}
			require.NoError(t, stream.CloseSend())
			_, err = stream.Recv()
			require.ErrorIs(t, err, io.EOF)
			require.Equal(t, tt.body, string(got))
			c.balanced()
			st := c.srv.Stats()
			require.EqualValues(t, 1, st.Completed)
			require.Equal(t, tt.wantCached, st.ActualCachedTokens)
		})
	}
}

// TestPanicEndsOnlyItsStream: a Tokenizer that panics on one prompt ends
// that request's stream with codes.Internal and is counted; the server
// goes on routing the next requests.
func TestPanicEndsOnlyItsStream(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 2, cfg: epp.Config{Tokenizer: epp.TokenizerFunc(
		func(ctx context.Context, req *openai.Request, dst []uint32) ([]uint32, error) {
			if strings.Contains(req.Prompt, "boom") {
				panic("tokenizer bug")
			}
			return fakeengine.Words(ctx, req, dst)
		})}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := c.sendCompletion(ctx, `{"model":"m","prompt":"boom boom"}`)
	_, err := stream.Recv()
	require.Equal(t, codes.Internal, status.Code(err), "%v", err)
	require.EqualValues(t, 1, c.srv.Stats().Panics)

	for i := range 3 {
		ex := c.do(envoyOpts{body: prompt(0, i, false)})
		require.NotEmpty(t, ex.endpoints)
	}
	c.balanced()
	require.EqualValues(t, 1, c.srv.Stats().Panics)
}
