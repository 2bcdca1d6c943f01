// Package dynamotest runs NVIDIA Dynamo 1.6.1's Python processes (its
// mocker workers and its frontend) for kvroute's live tests: the
// interpreter check that skips a test naming what is missing, a
// tokenizer-only model directory they serve, and processes killed when the
// test ends. Every address is on loopback.
package dynamotest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/loopback"
)

// Python returns the interpreter and PYTHONPATH that run Dynamo's
// mocker and frontend (KVROUTE_DYNAMO_PYTHON, default python3; PYTHONPATH
// joins KVROUTE_DYNAMO_MOCKER_PYTHONPATH and KVROUTE_DYNAMO_PYTHONPATH,
// set by .ci/setup-dynamo-mocker.sh and .ci/setup-dynamo.sh), or skips the
// test naming what is missing (fails it under KVROUTE_EXTERNAL_TESTS=1).
func Python(t *testing.T) (string, string) {
	t.Helper()
	py := os.Getenv("KVROUTE_DYNAMO_PYTHON")
	if py == "" {
		py = "python3"
	}
	var dirs []string
	for _, v := range []string{"KVROUTE_DYNAMO_MOCKER_PYTHONPATH", "KVROUTE_DYNAMO_PYTHONPATH"} {
		if d := os.Getenv(v); d != "" {
			dirs = append(dirs, d)
		}
	}
	path := strings.Join(dirs, string(os.PathListSeparator))
	var missing string
	if _, err := exec.LookPath(py); err != nil {
		missing = py
	} else {
		cmd := exec.Command(py, "-c", "import dynamo.mocker.main, dynamo.frontend.main")
		cmd.Env = append(os.Environ(), "PYTHONPATH="+path)
		if out, err := cmd.CombinedOutput(); err != nil {
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			missing = fmt.Sprintf("Dynamo's mocker and frontend (ai-dynamo and ai-dynamo-runtime 1.6.1) for %s: %s", py, lines[len(lines)-1])
		}
	}
	if missing == "" {
		return py, path
	}
	if os.Getenv("KVROUTE_EXTERNAL_TESTS") == "1" {
		t.Fatalf("missing %s (KVROUTE_EXTERNAL_TESTS=1)", missing)
	}
	t.Skipf("missing %s; source .ci/setup-dynamo.sh and .ci/setup-dynamo-mocker.sh with CI=true, or set KVROUTE_DYNAMO_PYTHON to a Python with ai-dynamo", missing)
	return "", ""
}

// WriteModel writes a tokenizer-only model directory that Dynamo's
// mocker and frontend serve: a byte-level BPE without merges (one token
// per byte), Llama-3-like special tokens and chat template, and reserved
// tokens up to a vocabulary of 4096, so that the ids the mocker emits
// (around 1,000 to 2,000) decode.
func WriteModel(t *testing.T, dir string) {
	t.Helper()
	// GPT-2's byte-to-character table.
	var chars []rune
	var rest []int
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			chars = append(chars, rune(b))
		} else {
			rest = append(rest, b)
		}
	}
	for i := range rest {
		chars = append(chars, rune(256+i))
	}
	vocab := map[string]int{}
	for i, c := range chars {
		vocab[string(c)] = i
	}
	specials := []string{"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
	for i := 0; len(vocab)+len(specials) < 4096; i++ {
		specials = append(specials, fmt.Sprintf("<|reserved_%d|>", i))
	}
	var added []map[string]any
	for _, s := range specials {
		vocab[s] = len(vocab)
		added = append(added, map[string]any{"id": vocab[s], "content": s, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true})
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
	files := map[string]any{
		"tokenizer.json": map[string]any{"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added,
			"normalizer": nil, "pre_tokenizer": byteLevel, "post_processor": byteLevel, "decoder": byteLevel,
			"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
				"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
				"vocab": vocab, "merges": []string{}}},
		"tokenizer_config.json": map[string]any{"bos_token": specials[0], "eos_token": specials[4],
			"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072,
			"chat_template": "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n" +
				"{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"},
		"config.json": map[string]any{"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "vocab_size": 4096,
			"max_position_embeddings": 131072, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
			"num_hidden_layers": 2, "intermediate_size": 128, "bos_token_id": 0, "eos_token_id": 4, "torch_dtype": "bfloat16"},
		"generation_config.json": map[string]any{"bos_token_id": 0, "eos_token_id": 4},
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for name, v := range files {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
	}
}

// Process is a running Dynamo process (mocker or frontend) in its
// own process group, killed when the test ends.
type Process struct {
	// Module is the Python module it runs ("dynamo.mocker").
	Module string
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
}

// Start runs python -m module args (Python's interpreter and path) with
// every address on loopback and the file store at store (DYN_FILE_KV). The
// process is killed, with its process group, when the test ends.
func Start(t *testing.T, store string, module string, args ...string) *Process {
	t.Helper()
	return StartEnv(t, []string{"DYN_FILE_KV=" + store}, module, args...)
}

// StartEnv is Start with the store given by env ("DYN_FILE_KV=dir", or
// "ETCD_ENDPOINTS=url" for --discovery-backend etcd, plus "NATS_SERVER=url"
// for --event-plane nats).
func StartEnv(t *testing.T, env []string, module string, args ...string) *Process {
	t.Helper()
	py, path := Python(t)
	log := filepath.Join(t.TempDir(), strings.ReplaceAll(module, ".", "-")+".log")
	f, err := os.Create(log)
	require.NoError(t, err)
	cmd := exec.Command(py, append([]string{"-m", module}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+path, "DYN_TCP_RPC_HOST=127.0.0.1",
		"DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1", "DYN_EVENT_PLANE_HOST=127.0.0.1", "DYN_SYSTEM_HOST=127.0.0.1", "DYN_LOG=info")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	p := &Process{Module: module, cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	})
	return p
}

// Stop sends sig to the process's group and waits until it exits (at
// most 30 s, then it is killed). SIGTERM stops Dynamo cleanly: it deletes
// what it registered. SIGKILL leaves its registrations behind.
func (p *Process) Stop(sig syscall.Signal) {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// Log returns the process's log so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// Tail returns the end of the process's log, for failure messages.
func (p *Process) Tail() string {
	b := p.Log()
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return b
}

// FreePort returns a loopback port nobody listens on right now, which no
// process binding port 0 (Dynamo's workers bind their event sockets so)
// can be given before the caller's process binds it (loopback.FreePort).
func FreePort(t testing.TB) int {
	p, err := loopback.FreePort()
	require.NoError(t, err)
	return p
}

// Instances returns the instance ids of the generate endpoints
// Dynamo's frontend sees (its /health).
func Instances(ctx context.Context, base string) ([]uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var h struct {
		Instances []struct {
			Endpoint   string `json:"endpoint"`
			InstanceID uint64 `json:"instance_id"`
		} `json:"instances"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return nil, err
	}
	var ids []uint64
	for _, in := range h.Instances {
		if in.Endpoint == "generate" {
			ids = append(ids, in.InstanceID)
		}
	}
	return ids, nil
}

// Serves reports whether Dynamo's frontend lists model.
func Serves(ctx context.Context, base, model string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&list) != nil {
		return false
	}
	for _, m := range list.Data {
		if m.ID == model {
			return true
		}
	}
	return false
}
