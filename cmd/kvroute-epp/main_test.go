package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/epp"
	"github.com/kvroute/kvroute/internal/etcdtest"
	"github.com/kvroute/kvroute/internal/fakeengine"
	"github.com/kvroute/kvroute/router"
)

// syncBuffer is a log sink safe for the picker's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startEngines(t *testing.T, textOnly ...bool) []string {
	var specs []string
	for i, to := range textOnly {
		e, err := fakeengine.Start(fakeengine.Config{ID: 1, TextOnly: to})
		require.NoError(t, err)
		t.Cleanup(e.Close)
		specs = append(specs, "-engine", fmt.Sprintf("e%d=%s,events=%s,replay=%s,topic=%s,metrics=%s/metrics,kind=vllm",
			i, e.Addr(), e.Events(), e.Replay(), fakeengine.Topic, e.URL()))
	}
	return specs
}

func TestPickerServes(t *testing.T) {
	args := append([]string{"-listen", "127.0.0.1:0", "-metrics-listen", "127.0.0.1:0", "-model", "m", "-log-level", "debug"},
		startEngines(t, false, false)...)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan addrs, 1)
	done := make(chan error, 1)
	logs := &syncBuffer{}
	go func() { done <- run(ctx, args, logs, ready) }()
	var a addrs
	select {
	case a = <-ready:
	case err := <-done:
		t.Fatalf("picker stopped: %v\n%s", err, logs)
	}
	conn, err := grpc.NewClient(a.GRPC.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	h := healthpb.NewHealthClient(conn)
	require.Eventually(t, func() bool {
		resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: epp.ServiceReadiness})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}, 10*time.Second, 20*time.Millisecond)

	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	require.NoError(t, err)
	hdr := func(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }
	require.NoError(t, stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			hdr(":method", "POST"), hdr(":path", "/v1/chat/completions")}}}}}))
	require.NoError(t, stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{EndOfStream: true, Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hello"}],"tools":[{"type":"function","function":{"name":"f"}}]}`)}}}))
	m, err := stream.Recv()
	require.NoError(t, err)
	dest := ""
	for _, h := range m.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == epp.HeaderDestination {
			dest = string(h.GetHeader().GetRawValue())
		}
	}
	require.Len(t, strings.Split(dest, ","), 2, "the pick and one fallback")
	require.NoError(t, stream.CloseSend())
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}

	resp, err := http.Get("http://" + a.Metrics.String() + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(body), "kvroute_epp_routed_total 1")
	require.Contains(t, logs.String(), "token parity probe passed")
	require.Contains(t, logs.String(), "engine=e1")

	cancel()
	require.NoError(t, <-done)
}

func TestPickerRefusesTemplateMismatch(t *testing.T) {
	engines := startEngines(t, false, true)
	base := append([]string{"-listen", "127.0.0.1:0", "-metrics-listen", "127.0.0.1:0", "-model", "m"}, engines...)
	err := run(context.Background(), base, io.Discard, nil)
	require.ErrorContains(t, err, "token parity probe failed")
	require.ErrorContains(t, err, "engine e1")

	// With -parity warn it starts, and says so loudly.
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan addrs, 1)
	done := make(chan error, 1)
	logs := &syncBuffer{}
	go func() { done <- run(ctx, append(base, "-parity", "warn"), logs, ready) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("picker stopped: %v", err)
	}
	require.Contains(t, logs.String(), "TOKEN PARITY PROBE FAILED")
	cancel()
	require.NoError(t, <-done)
}

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		args []string
		err  string
	}{
		{nil, "no engines"},
		{[]string{"-etcd", "http://127.0.0.1:2379"}, "no tokenizer"},
		{[]string{"-engine", "a=127.0.0.1:1", "-parity", "maybe"}, "want fail, warn or off"},
		{[]string{"-engine", "a=127.0.0.1:1", "-tokenizer-api", "tgi"}, "unknown API"},
		{[]string{"-engine", "nonsense"}, "NAME=HOST:PORT"},
		{[]string{"-engine", "a=127.0.0.1:1", "-adapter", "x"}, "MODEL=ADAPTER"},
		{[]string{"-kube-selector", "app=vllm"}, "needs -kube-ports"},
		{[]string{"-engine", "a=127.0.0.1:1", "-busy-kv", "-1"}, "scheduling"},
		{[]string{"-kube-pool", "llama"}, "no tokenizer"},
		{[]string{"-engine", "a=127.0.0.1:1", "-load-reports", "max"}, "want capacities or merged"},
		{[]string{"-kube-pool", "llama", "-kube-selector", "app=x", "-kube-ports", "8000", "-tokenizer", "http://t"}, "-kube-pool reads the selector"},
		{[]string{"-engine", "a=127.0.0.1:1", "-engine", "a=127.0.0.1:2"}, `engine "a" given twice`},
	} {
		_, err := parse(tt.args, io.Discard)
		require.ErrorContains(t, err, tt.err, tt.args)
	}
	c, err := parse([]string{"-engine", "a=127.0.0.1:1", "-adapter", "support=support-lora", "-fallbacks", "-1"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "http://127.0.0.1:1", c.Tokenizer)
	require.Equal(t, map[string]string{"support": "support-lora"}, c.Adapters)
	require.Equal(t, -1, c.Fallbacks)
	require.Equal(t, router.LoadReportCapacities, c.LoadReports)
}

// The load report mode comes from the file, and a flag overrides it.
func TestParseLoadReports(t *testing.T) {
	path := filepath.Join(t.TempDir(), "epp.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"engines": [{"name": "a", "host": "127.0.0.1", "ports": [1]}], "load_reports": "merged"}`), 0o600))
	for _, tt := range []struct {
		args []string
		want router.LoadReportMode
	}{
		{[]string{"-engine", "a=127.0.0.1:1"}, router.LoadReportCapacities},
		{[]string{"-engine", "a=127.0.0.1:1", "-load-reports", "merged"}, router.LoadReportMerged},
		{[]string{"-config", path}, router.LoadReportMerged},
		{[]string{"-config", path, "-load-reports", "capacities"}, router.LoadReportCapacities},
	} {
		c, err := parse(tt.args, io.Discard)
		require.NoError(t, err, tt.args)
		require.Equal(t, tt.want, c.LoadReports, tt.args)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"engines": [{"name": "a", "host": "127.0.0.1", "ports": [1]}], "load_reports": "max"}`), 0o600))
	_, err := parse([]string{"-config", bad}, io.Discard)
	require.ErrorContains(t, err, "want capacities or merged")
}

// A config file's settings fall back to the flags' defaults; its engines
// are checked as the flags' are, and one without a port makes no
// tokenizer.
func TestParseConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		path := filepath.Join(dir, strconv.Itoa(len(body))+".json")
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
		return path
	}
	c, err := parse([]string{"-config", write(`{"engines":[{"name":"a","host":"127.0.0.1","ports":[1]}]}`)}, io.Discard)
	require.NoError(t, err)
	require.True(t, *c.InjectUsage, "-inject-usage defaults to true")
	c, err = parse([]string{"-config", write(`{"engines":[{"name":"a","host":"127.0.0.1","ports":[1]}],"inject_usage":false}`)}, io.Discard)
	require.NoError(t, err)
	require.False(t, *c.InjectUsage)
	require.NotPanics(t, func() {
		_, err = parse([]string{"-config", write(`{"engines":[{"name":"a","host":"127.0.0.1","ranks":1}]}`)}, io.Discard)
	})
	require.ErrorContains(t, err, "no tokenizer")
	_, err = parse([]string{"-config", write(`{"engines":[{"name":"a","host":"127.0.0.1","ports":[0]}]}`)}, io.Discard)
	require.ErrorIs(t, err, discovery.ErrEngine)
}

// The static engines stay when a discovery source syncs its own.
func TestStaticEnginesStayBesideEtcd(t *testing.T) {
	_, url := etcdtest.Start(t)
	args := append([]string{"-listen", "127.0.0.1:0", "-metrics-listen", "127.0.0.1:0", "-parity", "off",
		"-etcd", url, "-etcd-prefix", "/empty/"}, startEngines(t, false)...)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan addrs, 1)
	done := make(chan error, 1)
	logs := &syncBuffer{}
	go func() { done <- run(ctx, args, logs, ready) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("picker stopped: %v\n%s", err, logs)
	}
	time.Sleep(time.Second) // the watcher's first listing
	before := logs.String()
	cancel()
	require.NoError(t, <-done)
	require.Contains(t, before, "discovery: engine added")
	require.NotContains(t, before, "discovery: engine removed", "%s", before)
}
