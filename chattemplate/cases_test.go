package chattemplate_test

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/chattemplate"
)

// TestCasesGolden renders small templates exercising one feature each and
// compares with jinja2 in transformers' environment
// (testdata/cases.json, written by testdata/cases.py).
func TestCasesGolden(t *testing.T) {
	b, err := os.ReadFile("testdata/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Vars  map[string]json.RawMessage `json:"vars"`
		Cases []struct {
			Template string                     `json:"template"`
			Vars     map[string]json.RawMessage `json:"vars"`
			Output   *string                    `json:"output"`
			Error    string                     `json:"error"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	vars := map[string]any{}
	for k, v := range g.Vars {
		vars[k] = v
	}
	for _, c := range g.Cases {
		tmpl, err := chattemplate.Parse(c.Template)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.Template, err)
			continue
		}
		merged := maps.Clone(vars)
		for k, v := range c.Vars {
			merged[k] = v
		}
		out, err := tmpl.Render(merged, chattemplate.Options{})
		var raised *chattemplate.RaisedError
		switch {
		case c.Output == nil && err == nil:
			t.Errorf("Render(%q) = %q, want error %q", c.Template, out, c.Error)
		case strings.HasPrefix(c.Error, "TemplateError: ") && (!errors.As(err, &raised) || "TemplateError: "+raised.Message != c.Error):
			t.Errorf("Render(%q): %v, want %q", c.Template, err, c.Error)
		case c.Output != nil && err != nil:
			t.Errorf("Render(%q): %v, want %q", c.Template, err, *c.Output)
		case c.Output != nil && out != *c.Output:
			t.Errorf("Render(%q) =\n %q, want\n %q", c.Template, out, *c.Output)
		}
	}
}
