package tcp_test

import (
	"testing"

	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/tcp"
	"github.com/kvroute/kvroute/transfer/transfertest"
)

func newAgent(t testing.TB, name string) transfer.Agent {
	t.Helper()
	a, err := tcp.New(tcp.Config{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestConformance(t *testing.T) {
	transfertest.TestAgent(t, newAgent)
}
