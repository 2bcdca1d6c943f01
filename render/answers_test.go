package render_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/render"
)

// TestClientRefusesBadAnswers: every answer that is not a list of token ids
// an engine could have given fails with ErrTokenize and says why.
func TestClientRefusesBadAnswers(t *testing.T) {
	huge := `{"token_ids":[` + strings.Repeat("1,", 9<<20) + `1]}`
	tests := []struct {
		name   string
		status int
		body   string
		want   string // in the error
	}{
		{"not found", http.StatusNotFound, `{"detail":"Not Found"}`, "404"},
		{"bad request", http.StatusBadRequest, `{"error":{"message":"bad template"}}`, "bad template"},
		{"unavailable", http.StatusServiceUnavailable, "", "503"},
		{"html", http.StatusOK, "<html>gateway</html>", "unreadable answer"},
		{"empty", http.StatusOK, "", "unreadable answer"},
		{"ids as a string", http.StatusOK, `{"token_ids":"1 2 3"}`, "unreadable answer"},
		{"negative id", http.StatusOK, `{"token_ids":[1,-1]}`, "unreadable answer"},
		{"id past uint32", http.StatusOK, `{"token_ids":[4294967296]}`, "unreadable answer"},
		{"fractional id", http.StatusOK, `{"tokens":[1.5]}`, "unreadable answer"},
		{"null ids", http.StatusOK, `{"token_ids":null}`, "no token ids"},
		{"two answers", http.StatusOK, `[{"token_ids":[1]},{"token_ids":[2]}]`, "unreadable answer"},
		{"no answer", http.StatusOK, `[]`, "unreadable answer"},
		{"trailing data", http.StatusOK, `{"token_ids":[1]} {"token_ids":[2]}`, "unreadable answer"},
		{"hashes without placeholders", http.StatusOK, `{"token_ids":[1,2,3],"features":{"mm_hashes":{"image":["a"]},"mm_placeholders":{}}}`, "hashes"},
		{"item past the ids", http.StatusOK, `{"token_ids":[1,2,3],"features":{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":2,"length":2}]}}}`, "invalid image item"},
		{"huge", http.StatusOK, huge, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			}))
			defer srv.Close()
			chat, err := openai.ParseRequest([]byte(`{"messages":[{"role":"user","content":"x"}]}`), openai.KindChat)
			if err != nil {
				t.Fatal(err)
			}
			ids, err := (&render.Client{URL: srv.URL}).Tokenize(context.Background(), chat, []uint32{7})
			if !errors.Is(err, render.ErrTokenize) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want ErrTokenize saying %q", err, tt.want)
			}
			if len(ids) != 1 || ids[0] != 7 {
				t.Fatalf("ids %v: dst changed on error", ids)
			}
		})
	}
}

// TestClientHonoursContext: a cancelled or expired context ends the round
// trip at once, with an error wrapping both ErrTokenize and the context's.
func TestClientHonoursContext(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	chat, err := openai.ParseRequest([]byte(`{"messages":[{"role":"user","content":"x"}]}`), openai.KindChat)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = (&render.Client{URL: srv.URL}).Tokenize(ctx, chat, nil)
	if !errors.Is(err, render.ErrTokenize) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want ErrTokenize and DeadlineExceeded", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	_, err = (&render.Client{URL: srv.URL}).Tokenize(ctx, chat, nil)
	if !errors.Is(err, render.ErrTokenize) || !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want ErrTokenize and Canceled", err)
	}
	_, err = (&render.Client{URL: srv.URL, HTTP: &http.Client{Timeout: 50 * time.Millisecond}}).Tokenize(context.Background(), chat, nil)
	if !errors.Is(err, render.ErrTokenize) {
		t.Fatalf("error %v, want ErrTokenize on the client's timeout", err)
	}
}

// TestProbeBodyIsJSON: the probe chat is valid JSON whatever the model's
// name holds.
func TestProbeBodyIsJSON(t *testing.T) {
	for _, model := range []string{"m", `a"b\c`, "\x7f\x00", "モデル/7B\u2028", "\xff"} {
		body := render.ProbeBody(model)
		var v struct {
			Model string `json:"model"`
		}
		if err := json.Unmarshal(body, &v); err != nil {
			t.Errorf("ProbeBody(%q) is not JSON: %v", model, err)
			continue
		}
		if want := strings.ToValidUTF8(model, "\uFFFD"); v.Model != want {
			t.Errorf("ProbeBody(%q) names model %q", model, v.Model)
		}
		if _, err := openai.ParseRequest(body, openai.KindChat); err != nil {
			t.Errorf("ProbeBody(%q): %v", model, err)
		}
	}
}

// TestClientItemsInPromptOrder: the multimodal items of several modalities
// come back ordered by offset on every call (the answer's modalities are a
// JSON object, read in no fixed order).
func TestClientItemsInPromptOrder(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"token_ids":[0,1,2,3,4,5,6,7,8,9],"features":{` +
			`"mm_hashes":{"image":["i1","i2"],"audio":["a1"],"video":["v1"]},` +
			`"mm_placeholders":{"image":[{"offset":6,"length":2},{"offset":0,"length":1}],"audio":[{"offset":3,"length":2}],"video":[{"offset":9,"length":1}]}}}`))
	}))
	defer srv.Close()
	chat, err := openai.ParseRequest([]byte(`{"messages":[{"role":"user","content":"x"}]}`), openai.KindChat)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		_, mm, err := (&render.Client{URL: srv.URL}).TokenizeMM(context.Background(), chat, nil)
		if err != nil {
			t.Fatal(err)
		}
		var offsets []int
		for _, o := range mm {
			offsets = append(offsets, o.Offset)
		}
		if want := []int{0, 3, 6, 9}; !slices.Equal(offsets, want) {
			t.Fatalf("item offsets %v, want %v", offsets, want)
		}
	}
}
