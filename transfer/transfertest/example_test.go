package transfertest_test

import (
	"testing"

	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/tcp"
	"github.com/kvroute/kvroute/transfer/transfertest"
)

// A backend's test runs the suite with a factory of its agents.
func ExampleTestAgent() {
	testConformance := func(t *testing.T) {
		transfertest.TestAgent(t, func(t testing.TB, name string) transfer.Agent {
			a, err := tcp.New(tcp.Config{Name: name})
			if err != nil {
				t.Fatal(err)
			}
			return a
		})
	}
	_ = testConformance
}
