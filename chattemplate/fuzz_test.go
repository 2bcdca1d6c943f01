package chattemplate_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/chattemplate"
)

// FuzzTemplate: any source parses or fails with an error, and a parsed
// template renders or fails with an error, never panics, within its step
// budget.
func FuzzTemplate(f *testing.F) {
	var g struct {
		Cases []struct {
			Template string `json:"template"`
		} `json:"cases"`
	}
	if b, err := os.ReadFile("testdata/cases.json"); err == nil && json.Unmarshal(b, &g) == nil {
		for _, c := range g.Cases {
			f.Add(c.Template)
		}
	}
	for _, fam := range []string{"qwen2/chat_template.jinja"} {
		if b, err := os.ReadFile(filepath.Join("..", "tokenizer", "testdata", fam)); err == nil {
			f.Add(string(b))
		}
	}
	vars := map[string]any{
		"messages": json.RawMessage(`[{"role":"system","content":"s"},{"role":"user","content":"hi"},
			{"role":"assistant","tool_calls":[{"id":"abcdefgh1","function":{"name":"f","arguments":{"a":1}}}]},{"role":"tool","content":"r"}]`),
		"tools":                 json.RawMessage(`[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`),
		"add_generation_prompt": true,
		"bos_token":             "<s>",
	}
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := chattemplate.Parse(src)
		if err != nil {
			return
		}
		_, _ = tmpl.Render(vars, chattemplate.Options{MaxSteps: 100_000})
	})
}
