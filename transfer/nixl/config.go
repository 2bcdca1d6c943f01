package nixl

import (
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
)

// LibName is the file name of NIXL's C API library.
const LibName = "libnixl_capi.so"

// DefaultPrefix is where NVIDIA's containers install NIXL.
const DefaultPrefix = "/opt/nvidia/nvda_nixl"

// Config configures an Agent. Only Name is required.
type Config struct {
	// Name is the agent's name, unique among the agents that talk to each
	// other.
	Name string
	// LibPath is the path of libnixl_capi.so, or of the directory holding
	// it. Zero means search: $NIXL_LIB_DIR, $NIXL_PREFIX/lib/<arch>-linux-gnu,
	// /opt/nvidia/nvda_nixl/lib/<arch>-linux-gnu, then the dynamic loader's
	// own search path (LD_LIBRARY_PATH, ld.so.cache).
	//
	// NIXL finds its plugins in $NIXL_PLUGIN_DIR, or else in the plugins
	// directory beside libnixl.so.
	LibPath string
	// Backends are the plugins the agent creates at start, with their
	// default parameters unless BackendParams names some. Zero means
	// ["UCX"].
	Backends []string
	// BackendParams overrides the parameters of the named plugins.
	BackendParams map[string]map[string]string
	// NoProgressThread turns NIXL's progress thread off; transfers then
	// advance only while Status, Wait or Notifs are called, and a transfer
	// between two agents of one process needs both polled. Zero keeps it on.
	NoProgressThread bool
	// Logger receives diagnostics. Nil means discard.
	Logger *slog.Logger
}

// triplet returns the Debian multiarch directory name for goarch.
func triplet(goarch string) string {
	switch goarch {
	case "amd64":
		return "x86_64-linux-gnu"
	case "arm64":
		return "aarch64-linux-gnu"
	case "ppc64le":
		return "powerpc64le-linux-gnu"
	case "s390x":
		return "s390x-linux-gnu"
	}
	return goarch + "-linux-gnu"
}

// libCandidates returns the paths New tries, in order.
func libCandidates(libPath string, getenv func(string) string, goarch string) []string {
	inDir := func(dir string) string { return filepath.Join(dir, LibName) }
	if libPath != "" {
		if st, err := os.Stat(libPath); err == nil && st.IsDir() {
			return []string{inDir(libPath)}
		}
		return []string{libPath}
	}
	var out []string
	if d := getenv("NIXL_LIB_DIR"); d != "" {
		out = append(out, inDir(d))
	}
	arch := triplet(goarch)
	if p := getenv("NIXL_PREFIX"); p != "" {
		out = append(out, inDir(filepath.Join(p, "lib", arch)))
	}
	out = append(out, inDir(filepath.Join(DefaultPrefix, "lib", arch)), LibName)
	return out
}

// defaultCandidates is libCandidates for this process.
func defaultCandidates(libPath string) []string {
	return libCandidates(libPath, os.Getenv, runtime.GOARCH)
}
