package main

import (
	"context"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/dynamotest"
)

// writeStartRankStore writes the captured file store of a worker serving
// two data-parallel ranks (discovery/dynamo's testdata/filestore-dp2),
// edited as Dynamo records the second node of a multi-node data-parallel
// deployment: ranks 2 and 3. Its files are fresh, as a live writer keeps
// them.
func writeStartRankStore(t *testing.T) string {
	t.Helper()
	src := filepath.Join("..", "..", "discovery", "dynamo", "testdata", "filestore-dp2")
	dir := t.TempDir()
	edit := strings.NewReplacer(`"data_parallel_start_rank":0`, `"data_parallel_start_rank":2`,
		`"dp_rank":0}`, `"dp_rank":2}`, `"dp_rank":1}`, `"dp_rank":3}`)
	edited := 0
	require.NoError(t, filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dir, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if v := edit.Replace(string(b)); v != string(b) {
			edited++
			b = []byte(v)
		}
		return os.WriteFile(filepath.Join(dir, rel), b, 0o644)
	}))
	require.Equal(t, 3, edited, "the card and both event sources")
	return dir
}

// TestDynamoStartRank runs the gateway in Dynamo mode on the store of a
// worker serving Dynamo's ranks 2 and 3, in front of a stand-in for
// Dynamo's frontend: every request names the worker and one of Dynamo's
// ranks 2 and 3, which the router knows as 0 and 1.
func TestDynamoStartRank(t *testing.T) {
	store := writeStartRankStore(t)
	model := filepath.Join(t.TempDir(), "model")
	dynamotest.WriteModel(t, model)
	var mu sync.Mutex
	ranks := map[string]int{}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			mu.Lock()
			ranks[r.Header.Get("X-Dynamo-Worker-Instance-Id")+"/"+r.Header.Get("X-Dynamo-Dp-Rank")]++
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
		}
	}))
	defer front.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addr, stop := startCommand(t, ctx, "-block-size", "16", "-model-dir", model,
		"-dynamo-store", "file:"+store, "-dynamo-frontend", front.URL)
	gw := "http://" + addr.String()
	sent := 0
	require.Eventually(t, func() bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, gw+"/v1/completions",
			strings.NewReader(`{"prompt":"a prompt `+strings.Repeat("x ", sent)+`"}`))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			sent++
		}
		return sent == 16
	}, 15*time.Second, 20*time.Millisecond, "the worker is discovered and served")
	require.NoError(t, stop())

	mu.Lock()
	defer mu.Unlock()
	const id = "8618516848692219396" // the captured worker's instance id
	total := 0
	for k, n := range ranks {
		require.Contains(t, []string{id + "/2", id + "/3"}, k, "Dynamo's ranks")
		total += n
	}
	require.Equal(t, 16, total)
}
