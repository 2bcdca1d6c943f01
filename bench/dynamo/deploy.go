package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/dynamotest"
	"github.com/kvroute/kvroute/internal/loopback"
)

// dynamoPackages are what the benchmark installs into its venv: Dynamo
// without its dependencies (one of them, aisimulate, is a placeholder that
// cannot be installed; only Dynamo's planner needs it), then the ordinary
// dependencies the mocker and the frontend import.
var dynamoPackages = [][]string{
	{"--no-deps", "ai-dynamo==1.6.1", "ai-dynamo-runtime==1.6.1"},
	{"aiohttp", "certifi", "kubernetes", "msgspec", "prometheus-client", "pyzmq", "redis", "tqdm",
		"transformers", "typing-extensions", "zstandard", "tokenizers", "uvloop", "jinja2"},
}

// loopbackEnv keeps every address Dynamo opens on 127.0.0.1.
var loopbackEnv = []string{
	"DYN_TCP_RPC_HOST=127.0.0.1",
	"DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1",
	"DYN_EVENT_PLANE_HOST=127.0.0.1",
	"DYN_SYSTEM_HOST=127.0.0.1",
	"DYN_LOG=warn",
}

// ensureVenv returns the python of venv, creating the venv and installing
// Dynamo into it when it has no dynamo package yet.
func ensureVenv(ctx context.Context, venv string, log *slog.Logger) (string, error) {
	py := filepath.Join(venv, "bin", "python")
	if err := exec.CommandContext(ctx, py, "-c", "import dynamo.mocker, dynamo.frontend, tokenizers").Run(); err == nil {
		return py, nil
	}
	log.Info("creating the venv and installing Dynamo 1.6.1", "venv", venv)
	if err := run(ctx, "python3", "-m", "venv", venv); err != nil {
		return "", err
	}
	for _, pkgs := range dynamoPackages {
		if err := run(ctx, py, append([]string{"-m", "pip", "install", "-q"}, pkgs...)...); err != nil {
			return "", err
		}
	}
	return py, nil
}

// ensureModel writes the tokenizer-only model directory with mkmodel.py
// unless it is there already.
func ensureModel(ctx context.Context, py, script, dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err == nil {
		return nil
	}
	return run(ctx, py, script, dir)
}

func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

// proc is a process the benchmark started.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

// Deployment is one fresh Dynamo deployment: mocker workers and a frontend,
// with their own file store, and optionally kvroute's gateway.
type Deployment struct {
	dir      string // the file store and the logs
	httpPort int    // the frontend's
	scenario *Scenario
	procs    []*proc
	stops    []func()
	log      *slog.Logger
}

// onStop registers f to run first when the deployment stops.
func (d *Deployment) onStop(f func()) { d.stops = append(d.stops, f) }

// start starts a process of the deployment in its own process group, with
// its output in dir/name.log.
func (d *Deployment) start(name string, env []string, bin string, args ...string) (*proc, error) {
	f, err := os.Create(filepath.Join(d.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), loopbackEnv...), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: f, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	d.procs = append(d.procs, p)
	d.log.Debug("started", "name", name, "pid", cmd.Process.Pid)
	return p, nil
}

// Stop stops every process of the deployment by its pid (SIGTERM to the
// process and its group, SIGKILL after 5 s), newest first, and waits for
// each.
func (d *Deployment) Stop() {
	for i := len(d.stops) - 1; i >= 0; i-- {
		d.stops[i]()
	}
	d.stops = nil
	for i := len(d.procs) - 1; i >= 0; i-- {
		p := d.procs[i]
		pid := p.cmd.Process.Pid
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			<-p.done
		}
		p.log.Close()
		d.log.Debug("stopped", "name", p.name, "pid", pid)
	}
	d.procs = nil
}

// exited returns an error naming a process of d that has exited.
func (d *Deployment) exited() error {
	for _, p := range d.procs {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited early: see %s", p.name, p.log.Name())
		default:
		}
	}
	return nil
}

// deployConfig describes a deployment.
type deployConfig struct {
	python      string
	model       string
	dir         string
	workers     int
	cacheBlocks int
	httpPort    int
	routerMode  string // the frontend's --router-mode: kv, round-robin, direct
	scenario    *Scenario
}

// Deploy starts cfg.workers mocker workers and the frontend, and waits
// until the frontend lists the model and the file store holds every
// worker.
func Deploy(ctx context.Context, cfg deployConfig, log *slog.Logger) (*Deployment, error) {
	if err := os.MkdirAll(filepath.Join(cfg.dir, "kv"), 0o755); err != nil {
		return nil, err
	}
	d := &Deployment{dir: cfg.dir, httpPort: cfg.httpPort, scenario: cfg.scenario, log: log}
	env := []string{"DYN_FILE_KV=" + filepath.Join(cfg.dir, "kv")}
	for i := range cfg.workers {
		args := []string{"-m", "dynamo.mocker",
			"--model-path", cfg.model, "--model-name", modelName,
			"--block-size", "16", "--num-gpu-blocks-override", strconv.Itoa(cfg.cacheBlocks),
			"--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq",
			"--speedup-ratio", "1"}
		if _, err := d.start(fmt.Sprintf("mocker%d", i), env, cfg.python, args...); err != nil {
			d.Stop()
			return nil, err
		}
	}
	_, err := d.start("frontend", env, cfg.python, "-m", "dynamo.frontend",
		"--http-host", "127.0.0.1", "--http-port", strconv.Itoa(cfg.httpPort),
		"--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq",
		"--router-mode", cfg.routerMode)
	if err != nil {
		d.Stop()
		return nil, err
	}
	if err := d.waitReady(ctx, cfg); err != nil {
		d.Stop()
		return nil, err
	}
	return d, nil
}

// modelName is the served model name.
const modelName = "tiny"

// waitReady waits until the frontend sees every worker and serves the
// model.
func (d *Deployment) waitReady(ctx context.Context, cfg deployConfig) error {
	ctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	base := fmt.Sprintf("http://127.0.0.1:%d", cfg.httpPort)
	for {
		if err := d.exited(); err != nil {
			return err
		}
		ids, _ := dynamotest.Instances(ctx, base)
		if len(ids) == cfg.workers && dynamotest.Serves(ctx, base, modelName) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("deployment not ready after 120 s (%d of %d workers registered): %w", len(ids), cfg.workers, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// freePort returns a loopback TCP port that is free now and that no
// process binding port 0 (the workers' event sockets) can be given before
// the process it is meant for binds it (loopback.FreePort).
func freePort() (int, error) { return loopback.FreePort() }
