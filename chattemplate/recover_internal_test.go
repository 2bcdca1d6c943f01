package chattemplate

import (
	"errors"
	"testing"
)

// TestRenderRecoversPanic: a panic inside the engine (here a filter
// missing from the table, which Parse never lets through) comes back from
// Render as an error wrapping ErrRender instead of ending the process.
func TestRenderRecoversPanic(t *testing.T) {
	tmpl := &Template{body: []node{
		&textNode{text: "before "},
		&outputNode{e: &filterExpr{name: "no_such_filter", arg: &literal{v: "x"}}},
	}}
	out, err := tmpl.Render(nil, Options{})
	if !errors.Is(err, ErrRender) || out != "" {
		t.Fatalf("Render = %q, %v; want no output and an error wrapping ErrRender", out, err)
	}
}
