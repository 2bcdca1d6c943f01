package nixl_test

import (
	"errors"
	"os"
	"testing"

	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/nixl"
	"github.com/kvroute/kvroute/transfer/transfertest"
)

// requireNIXL skips the test when NIXL cannot be loaded, unless
// KVROUTE_EXTERNAL_TESTS=1 demands it, and then fails it.
func requireNIXL(t testing.TB) {
	t.Helper()
	a, err := nixl.New(nixl.Config{Name: "probe"})
	if err == nil {
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !errors.Is(err, transfer.ErrUnavailable) {
		t.Fatalf("NIXL loaded but the probe agent failed: %v", err)
	}
	msg := "NIXL is not installed (set NIXL_LIB_DIR to the directory of libnixl_capi.so, or run .ci/setup-nixl.sh): " + err.Error()
	if os.Getenv("KVROUTE_EXTERNAL_TESTS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func newAgent(t testing.TB, name string) transfer.Agent {
	t.Helper()
	a, err := nixl.New(nixl.Config{Name: name, Backends: []string{"UCX", "POSIX"}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestConformance(t *testing.T) {
	requireNIXL(t)
	transfertest.TestAgent(t, newAgent)
}
