package chattemplate_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/chattemplate"
)

func TestParseRefuses(t *testing.T) {
	tests := []struct {
		src  string
		want error
	}{
		{"{% include 'other.jinja' %}", chattemplate.ErrUnsupported},
		{"{% extends 'base' %}", chattemplate.ErrUnsupported},
		{"{% raw %}x{% endraw %}", chattemplate.ErrUnsupported},
		{"{{ x | no_such_filter }}", chattemplate.ErrUnsupported},
		{"{{ x is no_such_test }}", chattemplate.ErrUnsupported},
		{"{% for x in y recursive %}{% endfor %}", chattemplate.ErrUnsupported},
		{"{{ f(*args) }}", chattemplate.ErrUnsupported},
		{"{% if x %}", chattemplate.ErrSyntax},
		{"{% endfor %}", chattemplate.ErrSyntax},
		{"{{ }}", chattemplate.ErrSyntax},
		{"{{ 'open }}", chattemplate.ErrSyntax},
		{"{{ x ", chattemplate.ErrSyntax},
		{"{% break %}", chattemplate.ErrSyntax},
		{"{{ a b }}", chattemplate.ErrSyntax},
		{"{{ " + strings.Repeat("(", 300) + "1" + strings.Repeat(")", 300) + " }}", chattemplate.ErrSyntax},
		{strings.Repeat("{% if x %}", 300), chattemplate.ErrSyntax},
	}
	for _, tt := range tests {
		if _, err := chattemplate.Parse(tt.src); !errors.Is(err, tt.want) {
			t.Errorf("Parse(%.40q) = %v, want %v", tt.src, err, tt.want)
		}
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		src  string
		want error
	}{
		{"{{ '%s' % 1 }}", chattemplate.ErrUnsupported},
		{"{{ 'x'.format(1) }}", chattemplate.ErrUnsupported},
		{"{{ nothing.attr }}", chattemplate.ErrRender},
		{"{% for i in range(100000000) %}{% endfor %}", chattemplate.ErrRender},
		{"{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", chattemplate.ErrRender},
		{"{% set x = 'ab' * 100000000 %}", chattemplate.ErrRender},
	}
	for _, tt := range tests {
		tmpl, err := chattemplate.Parse(tt.src)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.src, err)
			continue
		}
		if _, err := tmpl.Render(nil, chattemplate.Options{MaxSteps: 1_000_000}); !errors.Is(err, tt.want) {
			t.Errorf("Render(%q) = %v, want %v", tt.src, err, tt.want)
		}
	}
	tmpl, _ := chattemplate.Parse("{{ raise_exception('no ' ~ who) }}")
	_, err := tmpl.Render(map[string]any{"who": "way"}, chattemplate.Options{})
	var raised *chattemplate.RaisedError
	if !errors.As(err, &raised) || raised.Message != "no way" {
		t.Errorf("raise_exception: %v", err)
	}
	if _, err := tmpl.Render(map[string]any{"who": make(chan int)}, chattemplate.Options{}); !errors.Is(err, chattemplate.ErrInput) {
		t.Errorf("bad variable: %v", err)
	}
}
