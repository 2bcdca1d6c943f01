// Package etcdtest runs a one-member etcd server on loopback for tests.
package etcdtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvroute/kvroute/internal/loopback"
)

// Binary finds the etcd server: $KVROUTE_ETCD (set by .ci/setup-etcd.sh)
// or etcd on the PATH. Without it the test skips, unless
// KVROUTE_EXTERNAL_TESTS=1, when it fails.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("KVROUTE_ETCD"); p != "" {
		return p
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p
	}
	if os.Getenv("KVROUTE_EXTERNAL_TESTS") == "1" {
		t.Fatal("etcd server not found: install Debian's etcd-server or set KVROUTE_ETCD")
	}
	t.Skip("etcd server not found (Debian package etcd-server, or KVROUTE_ETCD)")
	return ""
}

// freePort returns a loopback port for etcd that no process binding port
// 0 can be given before etcd binds it (loopback.FreePort).
func freePort(t testing.TB) int {
	t.Helper()
	p, err := loopback.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Start runs etcd on loopback until the test ends and returns a client
// and the client URL.
func Start(t testing.TB) (*clientv3.Client, string) {
	t.Helper()
	bin := Binary(t)
	client := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	dir := t.TempDir()
	cmd := exec.Command(bin, "--name", "t", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "t="+peer, "--log-level", "error")
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
	})
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Get(ctx, "probe")
		cancel()
		if err == nil {
			return c, client
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd did not start (%v); its log is in %s", err, dir)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
