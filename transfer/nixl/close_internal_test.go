//go:build cgo

package nixl

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/transfer"
)

// newTestAgent returns an agent, or skips the test when NIXL cannot be
// loaded, unless KVROUTE_EXTERNAL_TESTS=1 demands it.
func newTestAgent(t *testing.T, cfg Config) *Agent {
	t.Helper()
	a, err := New(cfg)
	if errors.Is(err, transfer.ErrUnavailable) {
		msg := "NIXL is not installed (set NIXL_LIB_DIR to the directory of libnixl_capi.so, or run .ci/setup-nixl.sh): " + err.Error()
		if os.Getenv("KVROUTE_EXTERNAL_TESTS") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	require.NoError(t, err)
	return a
}

// TestCloseDestroysBackends checks that Close deregisters the memory still
// registered and destroys every backend the agent created, its configured
// ones and the ones created later.
func TestCloseDestroysBackends(t *testing.T) {
	for _, tc := range []struct {
		name     string
		backends []string
		more     string // a backend created after New, or ""
		regions  int    // DRAM regions left registered at Close
	}{
		{name: "UCX, nothing registered", backends: []string{"UCX"}},
		{name: "UCX, memory registered", backends: []string{"UCX"}, regions: 2},
		{name: "UCX, then POSIX", backends: []string{"UCX"}, more: "POSIX", regions: 3},
		{name: "UCX and POSIX", backends: []string{"UCX", "POSIX"}, regions: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newTestAgent(t, Config{Name: "close-" + tc.name, Backends: tc.backends})
			if tc.more != "" {
				_, err := a.CreateBackend(tc.more, nil)
				require.NoError(t, err)
			}
			if tc.regions > 0 {
				buf, err := transfer.AllocBuffer(tc.regions * 4096)
				require.NoError(t, err)
				// Freed after Close, which deregisters it.
				t.Cleanup(func() { require.NoError(t, buf.Free()) })
				for i := range tc.regions {
					require.NoError(t, a.RegisterMem(transfer.RegList{Kind: transfer.DRAM,
						Descs: []transfer.RegDesc{{Desc: buf.Desc(i*4096, 4096)}}}))
				}
			}
			backends := a.Backends()
			require.Len(t, backends, len(tc.backends)+min(len(tc.more), 1))

			require.NoError(t, a.Close())
			require.Empty(t, a.regions, "regions left registered")
			for _, b := range backends {
				require.Nil(t, b.(*backend).h, "backend %s not destroyed", b.Plugin())
			}
			require.ErrorIs(t, a.Close(), transfer.ErrClosed)
		})
	}
}

// TestForeignBackendRefused checks that request options naming a backend
// of another agent are refused: its handle is that agent's, and freed by
// that agent's Close.
func TestForeignBackendRefused(t *testing.T) {
	a := newTestAgent(t, Config{Name: "foreign-a"})
	defer func() { require.NoError(t, a.Close()) }()
	b := newTestAgent(t, Config{Name: "foreign-b"})
	foreign := b.Backends()[0]
	require.NoError(t, b.Close())
	_, err := a.opts(&transfer.RequestOptions{Backends: []transfer.Backend{foreign}})
	require.ErrorIs(t, err, transfer.ErrInvalidParam)
	require.ErrorContains(t, err, `agent "foreign-b"`)
}
