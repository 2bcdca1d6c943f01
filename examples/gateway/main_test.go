package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/examples/gateway/gateway"
)

func TestParse(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "engines.json")
	require.NoError(t, os.WriteFile(cfg, []byte(`{"listen":":9000","block_size":64,"remove_after":"1m",
		"engines":[{"id":1,"url":"http://a:8000","events":"tcp://a:5557"}]}`), 0o600))
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"engines":[{"id":1,"url":"http://a"}],"remove_after":"soon"}`), 0o600))
	tests := []struct {
		name       string
		args       []string
		wantListen string
		wantBlock  int
		wantIDs    []uint64
		wantRemove time.Duration
		wantErr    string
	}{
		{name: "flags", args: []string{"-engine", "1=http://a:8000", "-engine", "2=http://b:8000,events=tcp://b:5557"},
			wantListen: "127.0.0.1:8080", wantBlock: 16, wantIDs: []uint64{1, 2}},
		{name: "file", args: []string{"-config", cfg}, wantListen: ":9000", wantBlock: 64, wantIDs: []uint64{1}, wantRemove: time.Minute},
		{name: "flags override the file", args: []string{"-config", cfg, "-listen", ":9100", "-engine", "3=http://c:1"},
			wantListen: ":9100", wantBlock: 64, wantIDs: []uint64{1, 3}, wantRemove: time.Minute},
		{name: "no engines", args: nil, wantErr: "no engines"},
		{name: "dynamo", args: []string{"-dynamo-store", "file:/tmp/kv", "-dynamo-frontend", "http://127.0.0.1:8000", "-model-dir", dir,
			"-dynamo-callback-host", "10.0.0.5"}, wantListen: "127.0.0.1:8080", wantBlock: 16},
		{name: "dynamo etcd with engines", args: []string{"-dynamo-store", "etcd:http://127.0.0.1:2379", "-dynamo-frontend", "http://f:8000",
			"-model-dir", dir, "-engine", "4=http://d:1"}, wantListen: "127.0.0.1:8080", wantBlock: 16, wantIDs: []uint64{4}},
		{name: "dynamo without frontend", args: []string{"-dynamo-store", "file:/tmp/kv", "-model-dir", dir}, wantErr: "needs -dynamo-frontend"},
		{name: "dynamo without model", args: []string{"-dynamo-store", "file:/tmp/kv", "-dynamo-frontend", "http://f:8000"}, wantErr: "needs -model-dir"},
		{name: "dynamo bad store", args: []string{"-dynamo-store", "/tmp/kv", "-dynamo-frontend", "http://f:8000", "-model-dir", dir}, wantErr: "neither file:DIR nor etcd"},
		{name: "dynamo store without a directory", args: []string{"-dynamo-store", "file:", "-dynamo-frontend", "http://f:8000", "-model-dir", dir}, wantErr: "neither file:DIR nor etcd"},
		{name: "dynamo store without a URL", args: []string{"-dynamo-store", "etcd:,", "-dynamo-frontend", "http://f:8000", "-model-dir", dir}, wantErr: "neither file:DIR nor etcd"},
		{name: "model directory and tokenize URL", args: []string{"-engine", "1=http://a:8000", "-model-dir", dir, "-tokenize-url", "http://a:8000"},
			wantErr: "a model directory or a tokenize URL, not both"},
		{name: "negative health interval", args: []string{"-engine", "1=http://a:8000", "-health-interval", "-1s"}, wantErr: "not a positive duration"},
		{name: "negative remove-after", args: []string{"-engine", "1=http://a:8000", "-remove-after", "-1s"}, wantErr: "is negative"},
		{name: "render without tokenize URL", args: []string{"-engine", "1=http://a:8000", "-tokenize-render"}, wantErr: "needs a tokenize URL"},
		{name: "bad engine", args: []string{"-engine", "1=ftp://a"}, wantErr: "not http(s)"},
		{name: "bad duration in file", args: []string{"-config", bad}, wantErr: "soon"},
		{name: "missing file", args: []string{"-config", filepath.Join(dir, "none.json")}, wantErr: "no such file"},
		{name: "stray argument", args: []string{"-engine", "1=http://a", "extra"}, wantErr: "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parse(tt.args, io.Discard)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantListen, o.file.Listen)
			require.Equal(t, tt.wantBlock, o.file.BlockSize)
			require.Equal(t, tt.wantRemove, o.remove)
			var ids []uint64
			for _, e := range o.file.Engines {
				ids = append(ids, uint64(e.ID))
			}
			require.Equal(t, tt.wantIDs, ids)
		})
	}
}

// TestRun serves the gateway in front of a stub engine, sends it one
// completion and shuts it down.
func TestRun(t *testing.T) {
	engine := http.NewServeMux()
	engine.HandleFunc("/v1/completions", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	})
	engineLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	engineSrv := &http.Server{Handler: engine, ReadHeaderTimeout: time.Second}
	go func() { _ = engineSrv.Serve(engineLn) }()
	defer engineSrv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr, stop := startCommand(t, ctx, "-engine", "1=http://"+engineLn.Addr().String())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr.String()+"/v1/completions", strings.NewReader(`{"prompt":"hi"}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Equal(t, "1/0", resp.Header.Get(gateway.HeaderWorker))
	require.NoError(t, stop())
}

// startCommand runs the gateway command on a free loopback port with args
// (errors logged only) until stop is called, and returns its address once
// it serves; stop returns what run returned.
func startCommand(t *testing.T, ctx context.Context, args ...string) (addr net.Addr, stop func() error) {
	t.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, append([]string{"-listen", "127.0.0.1:0", "-log-level", "error"}, args...), io.Discard, ready)
	}()
	select {
	case addr = <-ready:
	case err := <-done:
		cancel()
		t.Fatal(err)
	}
	return addr, func() error {
		cancel()
		return <-done
	}
}
