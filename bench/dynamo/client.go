package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// workerHeader is the header Dynamo's frontend in direct mode reads the
// chosen worker from.
const workerHeader = "x-dynamo-worker-instance-id"

// Result is what one streamed chat completion measured.
type Result struct {
	Req *Request
	// Start is when the request was sent.
	Start        time.Time
	TTFT         time.Duration
	Latency      time.Duration
	PromptTokens int
	CachedTokens int
	OutputTokens int
	// Worker is the instance that served the request, from the response's
	// nvext.worker_id (Dynamo's frontend fills it when asked).
	Worker uint64
	// Predicted is the router's predicted cached tokens, -1 when the arm
	// predicts nothing.
	Predicted int
	Err       error
}

// chatBody is the JSON body of a chat completion.
type chatBody struct {
	Model         string         `json:"model"`
	Messages      []Message      `json:"messages"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions map[string]any `json:"stream_options"`
	NVExt         map[string]any `json:"nvext"`
}

// body encodes r for the model; tokens, when not nil, are its prompt's
// token ids for nvext.token_data, which Dynamo's frontend takes instead of
// tokenizing the prompt when a worker is named (as kvroute's gateway sends
// them).
func body(model string, r *Request, tokens []uint32) ([]byte, error) {
	nvext := map[string]any{"extra_fields": []string{"worker_id"}}
	if tokens != nil {
		nvext["token_data"] = tokens
	}
	return json.Marshal(chatBody{
		Model:         model,
		Messages:      r.Messages,
		MaxTokens:     r.MaxTokens,
		Stream:        true,
		StreamOptions: map[string]any{"include_usage": true},
		NVExt:         nvext,
	})
}

// chunk is the part of a streamed chat.completion.chunk the benchmark reads.
type chunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	NVExt *struct {
		WorkerID *struct {
			DecodeWorkerID  uint64 `json:"decode_worker_id"`
			PrefillWorkerID uint64 `json:"prefill_worker_id"`
		} `json:"worker_id"`
	} `json:"nvext"`
}

// send posts r to url and reads its stream. header, when not empty, is
// added to the request (the direct-mode worker choice); firstToken, when
// not nil, is called when the first content arrives.
func send(ctx context.Context, hc *http.Client, url, model string, r *Request, header http.Header, hooks Hooks) Result {
	firstToken := hooks.FirstToken
	res := Result{Req: r, Predicted: -1}
	b, err := body(model, r, hooks.Tokens)
	if err != nil {
		res.Err = err
		return res
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		res.Err = err
		return res
	}
	hr.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		hr.Header[k] = v
	}
	start := time.Now()
	res.Start = start
	resp, err := hc.Do(hr)
	if err != nil {
		res.Err = err
		return res
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		res.Err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		return res
	}
	if p := resp.Header.Get("x-kvroute-predicted-cached-tokens"); p != "" {
		if n, err := strconv.Atoi(p); err == nil {
			res.Predicted = n
		}
	}
	res.Err = readStream(resp.Body, func(c *chunk) {
		if res.TTFT == 0 && len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
			res.TTFT = time.Since(start)
			if firstToken != nil {
				firstToken()
			}
		}
		if c.NVExt != nil && c.NVExt.WorkerID != nil && res.Worker == 0 {
			res.Worker = c.NVExt.WorkerID.DecodeWorkerID
			if res.Worker == 0 {
				res.Worker = c.NVExt.WorkerID.PrefillWorkerID
			}
		}
		if u := c.Usage; u != nil {
			res.PromptTokens, res.OutputTokens = u.PromptTokens, u.CompletionTokens
			if u.PromptTokensDetails != nil {
				res.CachedTokens = u.PromptTokensDetails.CachedTokens
			}
		}
	})
	res.Latency = time.Since(start)
	if res.Err == nil && res.TTFT == 0 {
		res.Err = errors.New("stream ended without content")
	}
	return res
}

// readStream reads a server-sent event stream of chat chunks up to its
// [DONE] line, calling f for each chunk.
func readStream(r io.Reader, f func(*chunk)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			return nil
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			return fmt.Errorf("bad chunk %.80q: %w", data, err)
		}
		f(&c)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("stream ended before [DONE]")
}
