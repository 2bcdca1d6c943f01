package dynamotest_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/dynamotest"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenizer"
)

// The model directory loads in kvroute's tokenizer: 4096 ids, one token
// per byte of text, the chat template's special tokens.
func TestWriteModel(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "model")
	dynamotest.WriteModel(t, dir)
	m, err := tokenizer.LoadModel(dir, tokenizer.LoadOptions{})
	require.NoError(t, err)
	tests := []struct {
		kind openai.Kind
		body string
		want int
	}{
		{openai.KindCompletion, `{"model":"tiny","prompt":"hello"}`, 5}, // no BOS: the post-processor adds none
		{openai.KindChat, `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`, 1 + (1 + 4 + 1 + 2 + 2 + 1) + (1 + 9 + 1 + 2)},
	}
	for _, tt := range tests {
		req, err := openai.ParseRequest([]byte(tt.body), tt.kind)
		require.NoError(t, err)
		ids, err := m.EncodeRequest(nil, req)
		require.NoError(t, err)
		require.Len(t, ids, tt.want, tt.body)
		for _, id := range ids {
			require.Less(t, id, uint32(4096))
		}
	}
}
