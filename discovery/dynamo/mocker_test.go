package dynamo_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dynamoPython returns the interpreter and PYTHONPATH that run Dynamo's
// mocker (KVROUTE_DYNAMO_PYTHON, default python3; PYTHONPATH joins
// KVROUTE_DYNAMO_MOCKER_PYTHONPATH, set by .ci/setup-dynamo-mocker.sh, and
// KVROUTE_DYNAMO_PYTHONPATH, set by .ci/setup-dynamo.sh), or skips the
// test naming what is missing (fails it under KVROUTE_EXTERNAL_TESTS=1).
func dynamoPython(t *testing.T) (string, string) {
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
		cmd := exec.Command(py, "-c", "import dynamo.mocker.main")
		cmd.Env = append(os.Environ(), "PYTHONPATH="+path)
		if out, err := cmd.CombinedOutput(); err != nil {
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			missing = fmt.Sprintf("Dynamo's mocker (ai-dynamo and ai-dynamo-runtime 1.6.1) for %s: %s", py, lines[len(lines)-1])
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

// writeModel writes a tokenizer-only model directory the mocker accepts:
// a byte-level BPE with no merges (256 byte tokens and the chat
// template's special tokens), its chat template and a Llama-like config.
func writeModel(t *testing.T, dir string) {
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
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range files {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// mocker is one running Dynamo process (`python -m dynamo.mocker` worker or
// `python -m dynamo.frontend`).
type mocker struct {
	cmd    *exec.Cmd
	log    string
	exited chan struct{} // closed when the process has exited
}

// startMocker starts a mocker worker serving model "tiny" with blocks of
// 16 tokens and 800 cache blocks, all addresses on loopback. The test
// kills it at the end if it is still running.
func startMocker(t *testing.T, model string, env dynEnv) *mocker {
	t.Helper()
	return startDynamo(t, env, "dynamo.mocker", "--model-path", model, "--model-name", "tiny",
		"--block-size", "16", "--num-gpu-blocks-override", "800", "--speedup-ratio", "1")
}

// startFrontend starts Dynamo's OpenAI frontend on port, routing round
// robin to the workers it discovers.
func startFrontend(t *testing.T, env dynEnv, port int) *mocker {
	t.Helper()
	return startDynamo(t, env, "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", strconv.Itoa(port), "--router-mode", "round-robin")
}

// dynEnv names where Dynamo processes register and publish.
type dynEnv struct {
	// backend and store are "file" and DYN_FILE_KV, or "etcd" and
	// ETCD_ENDPOINTS.
	backend, store string
	// nats is NATS_SERVER for --event-plane nats; empty means zmq.
	nats string
}

// startDynamo runs python -m module with args and the store, planes and
// addresses every test process shares.
func startDynamo(t *testing.T, env dynEnv, module string, args ...string) *mocker {
	t.Helper()
	py, path := dynamoPython(t)
	log := filepath.Join(t.TempDir(), module+".log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	plane := "zmq"
	if env.nats != "" {
		plane = "nats"
	}
	cmd := exec.Command(py, append(append([]string{"-m", module}, args...), "--discovery-backend", env.backend,
		"--request-plane", "tcp", "--event-plane", plane)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+path, "DYN_TCP_RPC_HOST=127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1",
		"DYN_EVENT_PLANE_HOST=127.0.0.1", "DYN_SYSTEM_HOST=127.0.0.1", "DYN_LOG=info")
	if env.backend == "file" {
		cmd.Env = append(cmd.Env, "DYN_FILE_KV="+env.store)
	} else {
		cmd.Env = append(cmd.Env, "ETCD_ENDPOINTS="+env.store)
	}
	if env.nats != "" {
		cmd.Env = append(cmd.Env, "NATS_SERVER="+env.nats)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m := &mocker{cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(m.exited)
	}()
	t.Cleanup(func() { m.stop(t, syscall.SIGKILL) })
	return m
}

// stop sends sig to the mocker's process group and waits for it to exit.
func (m *mocker) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	select {
	case <-m.exited:
		return
	default:
	}
	_ = syscall.Kill(-m.cmd.Process.Pid, sig)
	select {
	case <-m.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
		<-m.exited
	}
}

// tail returns the end of the mocker's log, for failure messages.
func (m *mocker) tail() string {
	b, _ := os.ReadFile(m.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}
