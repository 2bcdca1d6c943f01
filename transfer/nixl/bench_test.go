package nixl_test

import (
	"testing"

	"github.com/kvroute/kvroute/transfer/transfertest"
)

func BenchmarkTransfer(b *testing.B) {
	requireNIXL(b)
	transfertest.Benchmark(b, newAgent)
}
