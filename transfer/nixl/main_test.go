package nixl_test

import (
	"os"
	"testing"
)

// TestMain keeps UCX on TCP between the agents of this test process. The
// tests pair agents inside one process, where UCX would otherwise pick
// its shared-memory transports: a peer agent closed by a test leaves its
// buffers mapped in the same address space, so a WRITE to it can still
// land and the conformance suite's closed-peer check (a transfer to a
// closed peer fails) would pass or fail by timing. Over TCP a closed peer
// is a closed connection, as a peer on another host or process is. A
// UCX_TLS set by the caller is kept.
func TestMain(m *testing.M) {
	if _, ok := os.LookupEnv("UCX_TLS"); !ok {
		if err := os.Setenv("UCX_TLS", "tcp"); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
