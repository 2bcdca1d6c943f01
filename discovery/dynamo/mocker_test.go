package dynamo_test

import (
	"strconv"
	"testing"

	"github.com/kvroute/kvroute/internal/dynamotest"
)

// dynEnv names where Dynamo processes register and publish.
type dynEnv struct {
	// backend and store are "file" and DYN_FILE_KV, or "etcd" and
	// ETCD_ENDPOINTS.
	backend, store string
	// nats is NATS_SERVER for --event-plane nats; empty means zmq.
	nats string
}

// start runs a Dynamo module on env's store and event plane.
func (env dynEnv) start(t *testing.T, module string, args ...string) *dynamotest.Process {
	t.Helper()
	vars := []string{"DYN_FILE_KV=" + env.store}
	if env.backend == "etcd" {
		vars = []string{"ETCD_ENDPOINTS=" + env.store}
	}
	plane := "zmq"
	if env.nats != "" {
		plane = "nats"
		vars = append(vars, "NATS_SERVER="+env.nats)
	}
	args = append(args, "--discovery-backend", env.backend, "--request-plane", "tcp", "--event-plane", plane)
	return dynamotest.StartEnv(t, vars, module, args...)
}

// startMocker starts a mocker worker serving model "tiny" with blocks of
// 16 tokens and 800 cache blocks (and the extra mocker arguments); the
// test kills it at the end if it is still running.
func startMocker(t *testing.T, model string, env dynEnv, extra ...string) *dynamotest.Process {
	t.Helper()
	return env.start(t, "dynamo.mocker", append([]string{"--model-path", model, "--model-name", "tiny",
		"--block-size", "16", "--num-gpu-blocks-override", "800", "--speedup-ratio", "1"}, extra...)...)
}

// startFrontend starts Dynamo's OpenAI frontend on port, routing round
// robin to the workers it discovers.
func startFrontend(t *testing.T, env dynEnv, port int) *dynamotest.Process {
	t.Helper()
	return env.start(t, "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", strconv.Itoa(port), "--router-mode", "round-robin")
}
