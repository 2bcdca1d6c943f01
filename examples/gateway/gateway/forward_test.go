package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
)

// forwardEngine is an engine that records the headers and trailers of
// each request it gets and answers with answer.
type forwardEngine struct {
	srv     *httptest.Server
	hits    atomic.Int32
	headers chan http.Header
}

func newForwardEngine(t *testing.T, answer func(w http.ResponseWriter)) *forwardEngine {
	e := &forwardEngine{headers: make(chan http.Header, 16)}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // trailers arrive after the body
		h := r.Header.Clone()
		for k, v := range r.Trailer {
			h["Trailer-"+k] = v
		}
		e.hits.Add(1)
		e.headers <- h
		answer(w)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// completion answers a small non-streamed completion.
func completion(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"choices":[{"text":"x"}]}`)
}

// forwardGateway serves a gateway over engines with the router's zero
// configuration.
func forwardGateway(t *testing.T, cfg gateway.Config) (*gateway.Gateway, *httptest.Server) {
	r, err := router.New(router.Config{})
	require.NoError(t, err)
	cfg.Router, cfg.HealthInterval = r, -1
	gw, err := gateway.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return gw, srv
}

const forwardBody = `{"model":"m","prompt":"hello there"}`

func postCompletion(t *testing.T, srv *httptest.Server, edit func(*http.Request)) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(forwardBody))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if edit != nil {
		edit(req)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

// The engine gets the router's choice of worker and rank and nothing the
// client says about them: neither in headers nor in trailers.
func TestForwardRoutingHeadersAreTheRouters(t *testing.T) {
	tests := []struct {
		name   string
		engine gateway.Engine
		edit   func(*http.Request)
		check  func(t *testing.T, h http.Header, worker string)
	}{
		{name: "a client's worker id in a trailer", engine: gateway.Engine{ID: 1, Preset: gateway.PresetDynamo},
			edit: func(r *http.Request) {
				r.Body = io.NopCloser(strings.NewReader(forwardBody))
				r.ContentLength = -1
				r.Trailer = http.Header{gateway.HeaderDynamoWorker: {"99"}}
			},
			check: func(t *testing.T, h http.Header, _ string) {
				require.Equal(t, []string{"1"}, h.Values(gateway.HeaderDynamoWorker))
				require.Empty(t, h.Values("Trailer-"+gateway.HeaderDynamoWorker))
			}},
		{name: "ranks with headers of the engine's own", engine: gateway.Engine{ID: 1, Ranks: 2, Headers: map[string]string{"Authorization": "Bearer k"}},
			edit: func(r *http.Request) { r.Header.Set("X-Data-Parallel-Rank", "9") },
			check: func(t *testing.T, h http.Header, worker string) {
				_, rank, _ := strings.Cut(worker, "/")
				require.Equal(t, []string{rank}, h.Values("X-Data-Parallel-Rank"))
				require.Equal(t, "Bearer k", h.Get("Authorization"))
			}},
		{name: "a client's rank to a single-rank engine", engine: gateway.Engine{ID: 1},
			edit: func(r *http.Request) { r.Header.Set("X-Data-Parallel-Rank", "3") },
			check: func(t *testing.T, h http.Header, _ string) {
				require.Empty(t, h.Values("X-Data-Parallel-Rank"))
			}},
		{name: "a rank header of the engine's own replaces vLLM's", engine: gateway.Engine{ID: 1, Ranks: 2, Headers: map[string]string{"X-Rank": "{rank}"}},
			edit: func(r *http.Request) { r.Header.Set("X-Data-Parallel-Rank", "9") },
			check: func(t *testing.T, h http.Header, worker string) {
				_, rank, _ := strings.Cut(worker, "/")
				require.Equal(t, rank, h.Get("X-Rank"))
				require.Empty(t, h.Values("X-Data-Parallel-Rank"))
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newForwardEngine(t, completion)
			tt.engine.URL = e.srv.URL
			_, srv := forwardGateway(t, gateway.Config{Engines: []gateway.Engine{tt.engine}})
			resp, body := postCompletion(t, srv, tt.edit)
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			tt.check(t, <-e.headers, resp.Header.Get(gateway.HeaderWorker))
		})
	}
}

// When every engine fails, the client gets the last engine's answer with
// its Retry-After, and a frontend's refusal of the worker it was named is
// never passed off as the client's fault. Retries count only attempts
// made.
func TestForwardLastFailure(t *testing.T) {
	tests := []struct {
		name        string
		preset      string
		answer      func(w http.ResponseWriter)
		wantStatus  int
		wantHeader  string // Retry-After
		wantRetries uint64
	}{
		{name: "overloaded", answer: func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "30")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"error":"busy"}`)
		}, wantStatus: http.StatusTooManyRequests, wantHeader: "30"},
		{name: "unavailable", answer: func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}, wantStatus: http.StatusServiceUnavailable},
		{name: "dynamo refuses the worker", preset: gateway.PresetDynamo, answer: func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"message":"Invalid request","type":"Bad Request","code":400}`)
		}, wantStatus: http.StatusBadGateway},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newForwardEngine(t, tt.answer)
			gw, srv := forwardGateway(t, gateway.Config{Engines: []gateway.Engine{{ID: 1, URL: e.srv.URL, Preset: tt.preset}}})
			resp, body := postCompletion(t, srv, nil)
			require.Equal(t, tt.wantStatus, resp.StatusCode, body)
			require.Equal(t, tt.wantHeader, resp.Header.Get("Retry-After"))
			require.Equal(t, "1/0", resp.Header.Get(gateway.HeaderWorker))
			require.Equal(t, int32(1), e.hits.Load())
			require.Zero(t, gw.Stats().Retries, "one engine: no retry was made")
		})
	}
}

// A finished answer too large to relay is an error for the client, not
// a failure of the engine: no other engine runs the request again.
func TestForwardOversizedAnswer(t *testing.T) {
	big := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"text":%q}]}`, strings.Repeat("x", 4096))
	}
	var engines []gateway.Engine
	var all []*forwardEngine
	for i := range 3 {
		e := newForwardEngine(t, big)
		all = append(all, e)
		engines = append(engines, gateway.Engine{ID: kvroute.WorkerID(i + 1), URL: e.srv.URL})
	}
	gw, srv := forwardGateway(t, gateway.Config{Engines: engines, MaxResponseBytes: 1024})
	resp, body := postCompletion(t, srv, nil)
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, body)
	require.Contains(t, body, "exceeds 1024 bytes")
	var hits int32
	for _, e := range all {
		hits += e.hits.Load()
	}
	require.Equal(t, int32(1), hits)
	require.Zero(t, gw.Stats().Retries)
}

// A client that goes away while its prompt is being tokenized is not
// counted as a failed request (the gateway answered it nothing) and no
// engine is asked.
func TestClientGoneDuringTokenizing(t *testing.T) {
	eng := newForwardEngine(t, completion)
	started := make(chan struct{})
	tok := gateway.TokenizerFunc(func(ctx context.Context, _ *openai.Request, dst []uint32) ([]uint32, error) {
		close(started)
		<-ctx.Done() // a remote tokenizer's round trip, cut short
		return dst, fmt.Errorf("%w: %w", gateway.ErrTokenize, ctx.Err())
	})
	gw, srv := forwardGateway(t, gateway.Config{Tokenizer: tok, Engines: []gateway.Engine{{ID: 1, URL: eng.srv.URL}}})
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(forwardBody))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-started
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	srv.Close() // waits for the handler to end
	require.EqualValues(t, 1, gw.Stats().Requests)
	require.Zero(t, gw.Stats().Failed, "a request its client abandoned counted as failed")
	require.Zero(t, eng.hits.Load())
}

// The engine's answer is the verdict on its health: a success clears its
// errors and a 5xx adds one, while an overloaded engine (429) and an
// engine that judged the request itself (4xx) get no verdict, so that an
// engine failing its requests is not forgiven by a busy spell or by
// clients' bad requests.
func TestForwardAnswerIsTheVerdict(t *testing.T) {
	tests := []struct {
		status int
		want   router.Health
		errors int // the worker's errors after the request, counted by health
	}{
		{http.StatusOK, router.Healthy, 0},
		{http.StatusTooManyRequests, router.Degraded, 3},
		{http.StatusBadRequest, router.Degraded, 3},
		{http.StatusNotFound, router.Degraded, 3},
		{http.StatusInternalServerError, router.Degraded, 4},
	}
	for _, tt := range tests {
		t.Run(http.StatusText(tt.status), func(t *testing.T) {
			e := newForwardEngine(t, func(w http.ResponseWriter) {
				if tt.status == http.StatusOK {
					completion(w)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tt.status)
				fmt.Fprint(w, `{"error":{"message":"no"}}`)
			})
			gw, srv := forwardGateway(t, gateway.Config{MaxAttempts: 1, Engines: []gateway.Engine{{ID: 1, URL: e.srv.URL}}})
			r, w1 := gw.Router(), kvroute.WorkerKey{ID: 1}
			for range 3 {
				require.NoError(t, r.ReportError(w1, errors.New("connection reset")))
			}
			resp, body := postCompletion(t, srv, nil)
			require.Equal(t, tt.status, resp.StatusCode, body)
			srv.Close() // waits for the handler, which ends the decision after the answer
			h, _ := r.Health(w1)
			require.Equal(t, tt.want, h)
			// Errors up to UnhealthyErrors (5) tell the count apart.
			for range 5 - tt.errors - 1 {
				require.NoError(t, r.ReportError(w1, errors.New("connection reset")))
			}
			h, _ = r.Health(w1)
			require.NotEqual(t, router.Unhealthy, h, "more errors counted than the answers gave")
			require.NoError(t, r.ReportError(w1, errors.New("connection reset")))
			h, _ = r.Health(w1)
			require.Equal(t, router.Unhealthy, h, "fewer errors counted than the answers gave")
		})
	}
}

// closingClient is a client that closes its connection as soon as it has
// its whole answer, which may be before the gateway's handler returns:
// the request's context then ends while the handler finishes.
type closingClient struct {
	*httptest.ResponseRecorder
	close context.CancelFunc
}

func (c *closingClient) Write(p []byte) (int, error) {
	n, err := c.ResponseRecorder.Write(p)
	c.close() // the answer is one write: the client has it all
	return n, err
}

// A client that leaves once it has its whole answer does not make the
// answer a cancellation: the engine served it, the success clears its
// errors, and the cached tokens it reported feed routing accuracy.
func TestForwardClientLeavesAfterItsAnswer(t *testing.T) {
	e := newForwardEngine(t, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"text":"x"}],"usage":{"prompt_tokens":2,"prompt_tokens_details":{"cached_tokens":1}}}`)
	})
	gw, _ := forwardGateway(t, gateway.Config{MaxAttempts: 1, Engines: []gateway.Engine{{ID: 1, URL: e.srv.URL}}})
	r, w1 := gw.Router(), kvroute.WorkerKey{ID: 1}
	for range 3 {
		require.NoError(t, r.ReportError(w1, errors.New("connection reset")))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/completions", strings.NewReader(forwardBody))
	client := &closingClient{ResponseRecorder: httptest.NewRecorder(), close: cancel}
	gw.ServeHTTP(client, req)
	require.Equal(t, http.StatusOK, client.Code, client.Body.String())
	require.Error(t, ctx.Err(), "the client left before the handler returned")
	h, _ := r.Health(w1)
	require.Equal(t, router.Healthy, h, "the answer was not counted as a success")
	st := r.Stats()
	require.EqualValues(t, 1, st.Outcomes)
	require.EqualValues(t, 1, st.ActualCachedTokens, "the engine's cached tokens were dropped")
}
