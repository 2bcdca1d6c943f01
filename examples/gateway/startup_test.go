package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/dynamotest"
	"github.com/kvroute/kvroute/internal/etcdtest"
)

// startedBy returns the stacks of the live goroutines running code of one
// of the packages, by goroutine header ("goroutine 12 [select]:").
func startedBy(packages ...string) map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		stack := string(g)
		header, _, _ := strings.Cut(stack, "\n")
		id, _, _ := strings.Cut(strings.TrimPrefix(header, "goroutine "), " ")
		for _, p := range packages {
			if strings.Contains(stack, p) {
				out[id] = stack
				break
			}
		}
	}
	return out
}

// requireNoneLeft fails unless every goroutine of the packages that was
// not running before (by id, from startedBy) has ended.
func requireNoneLeft(t *testing.T, before map[string]string, packages ...string) {
	t.Helper()
	var left []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		left = left[:0]
		for id, stack := range startedBy(packages...) {
			if _, ok := before[id]; !ok {
				left = append(left, stack)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.Empty(t, left, "goroutines left running")
}

// A gateway that cannot listen returns the error and leaves nothing of
// what it started before running: not the Dynamo mode's pool nor its etcd
// client.
func TestStartupFailureStopsWhatStarted(t *testing.T) {
	model := filepath.Join(t.TempDir(), "model")
	dynamotest.WriteModel(t, model)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nobody := closed.Addr().String()
	require.NoError(t, closed.Close())
	packages := []string{"kvroute/kvroute/discovery", "kvroute/kvroute/kvevents", "go.etcd.io/", "google.golang.org/grpc"}
	tests := []struct {
		name  string
		store string
	}{
		{"file store", "file:" + t.TempDir()},
		{"etcd store", "etcd:http://" + nobody},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := startedBy(packages...)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, []string{"-listen", taken.Addr().String(), "-log-level", "error", "-model-dir", model,
					"-dynamo-store", tt.store, "-dynamo-frontend", "http://" + nobody}, io.Discard, nil)
			}()
			select {
			case err := <-done:
				require.ErrorContains(t, err, "address already in use")
			case <-ctx.Done():
				t.Fatal("the gateway hung on a port in use")
			}
			requireNoneLeft(t, before, packages...)
		})
	}
}

// A gateway in Dynamo mode that started and is then stopped leaves
// nothing running either: its pool, its subscriber and its store client
// end with run.
func TestShutdownStopsWhatStarted(t *testing.T) {
	model := filepath.Join(t.TempDir(), "model")
	dynamotest.WriteModel(t, model)
	packages := []string{"kvroute/kvroute/discovery", "kvroute/kvroute/kvevents", "go.etcd.io/", "google.golang.org/grpc"}
	tests := []struct {
		name  string
		store func(t *testing.T) string
	}{
		{"file store", func(t *testing.T) string { return "file:" + writeStartRankStore(t) }},
		{"etcd store", func(t *testing.T) string {
			_, url := etcdtest.Start(t) // skips without an etcd server
			return "etcd:" + url
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := tt.store(t)
			before := startedBy(packages...)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, stop := startCommand(t, ctx, "-model-dir", model, "-dynamo-store", store, "-dynamo-frontend", "http://127.0.0.1:1")
			require.NoError(t, stop())
			requireNoneLeft(t, before, packages...)
		})
	}
}
