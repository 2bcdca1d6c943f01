package gateway_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/examples/gateway/gateway"
	"github.com/kvroute/kvroute/internal/fakeengine"
)

// fakeEngine is an OpenAI-compatible engine on loopback with a real prefix
// cache that publishes vLLM KV events over ZMQ (package
// internal/fakeengine); its tokenizer agrees with gateway.WordTokenizer.
type fakeEngine struct {
	*fakeengine.Engine
}

func newFakeEngine(t testing.TB, id kvroute.WorkerID, blockSize, capacity, chunks int, delay time.Duration) *fakeEngine {
	e, err := fakeengine.Start(fakeengine.Config{ID: id, BlockSize: blockSize, Capacity: capacity, Chunks: chunks, Delay: delay})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	return &fakeEngine{e}
}

// engine describes the fake to the gateway.
func (e *fakeEngine) engine() gateway.Engine {
	return gateway.Engine{ID: e.ID(), URL: e.URL(), Events: e.Events(), Replay: e.Replay(), Topic: fakeengine.Topic}
}

// kill stops the engine at once: open connections are cut, the sockets
// closed.
func (e *fakeEngine) kill() { e.Close() }
