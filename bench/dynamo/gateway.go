package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"
)

// prepareArms builds what the chosen arms need before the runs start: the
// gateway binary for the kvroute arm.
func (b *bench) prepareArms(ctx context.Context) error {
	if !contains(b.o.arms, "kvroute") || b.o.gateway != "" {
		return nil
	}
	b.o.gateway = filepath.Join(b.o.dir, "gateway")
	b.log.Info("building the gateway", "out", b.o.gateway)
	return run(ctx, "go", "build", "-o", b.o.gateway, "./examples/gateway")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// setupGateway starts kvroute's gateway in its Dynamo mode, with its
// default configuration, in front of the frontend (in direct mode): it
// discovers the workers in the deployment's file store, follows their KV
// events and load on Dynamo's event plane and tokenizes with the model
// directory. It returns once the gateway routes to every worker.
func setupGateway(ctx context.Context, b *bench, d *Deployment, frontendPort int) (string, Chooser, error) {
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	args := []string{
		"-listen", addr, "-block-size", "16", "-model-dir", b.o.model,
		"-dynamo-store", "file:" + filepath.Join(d.dir, "kv"),
		"-dynamo-frontend", fmt.Sprintf("http://127.0.0.1:%d", frontendPort),
		"-dynamo-model", modelName,
	}
	args = append(args, strings.Fields(b.o.gatewayArgs)...)
	if _, err := d.start("gateway", nil, b.o.gateway, args...); err != nil {
		return "", nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := gatewayWorkers(ctx, "http://"+addr+"/metrics")
		if err == nil && n >= b.o.workers {
			break
		}
		if err := d.exited(); err != nil {
			return "", nil, err
		}
		if time.Now().After(deadline) {
			return "", nil, fmt.Errorf("the gateway routes to %d of %d workers after 60 s (%v): see %s", n, b.o.workers, err, filepath.Join(d.dir, "gateway.log"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	return "http://" + addr + "/v1/chat/completions", nil, nil
}

// gatewayWorkers returns the number of cache domains the gateway's router
// reports a health for on its metrics endpoint.
func gatewayWorkers(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("metrics: HTTP %d", resp.StatusCode)
	}
	n := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "kvroute_router_worker_health{") {
			n++
		}
	}
	return n, sc.Err()
}
