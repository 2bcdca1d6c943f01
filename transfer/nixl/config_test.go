package nixl

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/transfer"
)

func TestLibCandidates(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		libPath string
		env     map[string]string
		goarch  string
		want    []string
	}{
		{
			name: "defaults", goarch: "amd64",
			want: []string{"/opt/nvidia/nvda_nixl/lib/x86_64-linux-gnu/libnixl_capi.so", "libnixl_capi.so"},
		},
		{
			name: "environment", goarch: "arm64",
			env: map[string]string{"NIXL_LIB_DIR": "/wheel/libs", "NIXL_PREFIX": "/usr/local/nixl"},
			want: []string{
				"/wheel/libs/libnixl_capi.so",
				"/usr/local/nixl/lib/aarch64-linux-gnu/libnixl_capi.so",
				"/opt/nvidia/nvda_nixl/lib/aarch64-linux-gnu/libnixl_capi.so",
				"libnixl_capi.so",
			},
		},
		{
			name: "explicit file wins", libPath: "/x/libnixl_capi.so", goarch: "amd64",
			env:  map[string]string{"NIXL_LIB_DIR": "/ignored"},
			want: []string{"/x/libnixl_capi.so"},
		},
		{
			name: "explicit directory", libPath: dir, goarch: "amd64",
			want: []string{filepath.Join(dir, LibName)},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := libCandidates(tc.libPath, func(k string) string { return tc.env[k] }, tc.goarch)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestNewUnavailable(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nothing-here", LibName)
	_, err := New(Config{Name: "a", LibPath: missing})
	require.True(t, errors.Is(err, transfer.ErrUnavailable), "got %v", err)
	// The error names the path tried and the loader's (or cgo's) reason.
	require.True(t, strings.Contains(err.Error(), missing) || strings.Contains(err.Error(), "cgo"), err.Error())
	_, err = New(Config{Name: ""})
	require.Error(t, err)
}
