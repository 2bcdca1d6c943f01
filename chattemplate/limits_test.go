package chattemplate_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/chattemplate"
	"github.com/kvroute/kvroute/internal/cputime"
)

// Limits on one render of renderBounded. The slowest template below takes
// about 0.8 s of CPU time under the race detector, and up to 3 s of
// elapsed time on a 2-core machine busy with other builds and tests, so
// promptness is held to a bound of CPU time, which other jobs on the
// machine do not inflate; the bound of elapsed time only catches a render
// that never ends.
const (
	renderCPULimit  = 5 * time.Second
	renderWallLimit = time.Minute
)

// renderBounded renders src with no variables in a goroutine, turning a
// panic into an error, failing the test when the render took more than
// renderCPULimit of the process's CPU time (where it can be read), and
// giving up after renderWallLimit.
func renderBounded(t *testing.T, src string) (string, error) {
	t.Helper()
	tmpl, err := chattemplate.Parse(src)
	if err != nil {
		t.Fatalf("Parse(%q): %v", src, err)
	}
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	cpu0, cpuOK := cputime.Process()
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- result{err: fmt.Errorf("panic: %v", p)}
			}
		}()
		out, err := tmpl.Render(nil, chattemplate.Options{})
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		if cpu1, ok := cputime.Process(); cpuOK && ok {
			if used := time.Duration(cpu1 - cpu0); used > renderCPULimit {
				t.Errorf("Render(%q) took %v of CPU time, more than %v", src, used, renderCPULimit)
			}
		}
		return r.out, r.err
	case <-time.After(renderWallLimit):
		t.Fatalf("Render(%q) still running after %v", src, renderWallLimit)
		return "", nil
	}
}

// TestHostileTemplatesBounded: templates whose arithmetic, repetition,
// slicing or string building would run for ever, panic or exhaust memory
// render as jinja2 does where that is small, and otherwise fail with an
// error wrapping ErrRender, promptly.
func TestHostileTemplatesBounded(t *testing.T) {
	const grow = "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s OP ns.s %}{% endfor %}{{ ns.s|length }}"
	cases := []struct {
		src  string
		want string // "" means an error wrapping ErrRender
	}{
		{"{{ 1 ** 1000000000000 }}", "1"},
		{"{{ (-1) ** 1000000000001 }} {{ 0 ** 1000000000000 }} {{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 3 ** 0 }} {{ 7 ** 3 }}", "-1 0 4611686018427387904 -9223372036854775808 1 343"},
		{"{{ 2 ** 63 }}", ""},
		{"{% set s = 'a' * 40000000 %}{{ s }}{{ s }}", ""},
		{"{{ 2 ** 1000000000000 }}", ""},
		{"{{ 9223372036854775807 + 1 }}", ""},
		{"{{ -9223372036854775807 - 2 }}", ""},
		{"{{ 4611686018427387904 * 2 }}", ""},
		{"{{ 'abcd' * 4611686018427387904 }}", ""},
		{"{{ 4611686018427387904 * 'abcd' }}", ""},
		{"{{ ['a', 'b'] * 4611686018427387904 }}", ""},
		{"{{ ([] * 4611686018427387904) | length }} {{ '' * 4611686018427387904 }}|{{ 'ab' * 3 }} {{ [1] * 2 }}", "0 |ababab [1, 1]"},
		{"{{ 'abc'[1::9223372036854775807] }}", "b"},
		{"{{ 'abc'[::-9223372036854775807] }} {{ 'abc'[-9223372036854775807:9223372036854775807:9223372036854775807] }}", "c a"},
		{"{{ [1, 2, 3][1::9223372036854775807] }} {{ [1, 2, 3][::-9223372036854775807] }} {{ 'abcdef'[5:0:-2] }} {{ 'abcdef'[-100:100:3] }}", "[2] [3] fdb ad"},
		{"{{ 'a'.zfill(9223372036854775807) }}", ""},
		{"{{ 'a\\nb'|indent(9223372036854775807) }}", ""},
		{"{{ 'a\\nb'|indent(100000000) }}", ""},
		{"{{ [1]|tojson(indent=9223372036854775807) }}", ""},
		{"{{ '-4'.zfill(4) }} {{ 'a\\nb'|indent(2) }}", "-004 a\n  b"},
		{strings.ReplaceAll(grow, "OP", "~"), ""},
		{strings.ReplaceAll(grow, "OP", "+"), ""},
		{"{{ ('a' * 20000000).replace('a', 'aaaa')|length }}", ""},
		{"{{ ('a' * 20000000)|replace('a', 'aaaa')|length }}", ""},
		{"{{ ('a' * 20000000).replace('', 'aaaa')|length }}", ""},
		{"{{ 'abab'.replace('a', 'xyz', 1) }} {{ 'abab'|replace('b', '', 5) }} {{ 'ab'.replace('', '-') }}", "xyzbab aa -a-b-"},
		{"{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s.join([ns.s, ns.s, '']) %}{% endfor %}{{ ns.s|length }}", ""},
		{"{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = [ns.s, ns.s]|join(ns.s) %}{% endfor %}{{ ns.s|length }}", ""},
		{"{% set ns = namespace(s='a\\n\\n\\n\\n') %}{% for i in range(40) %}{% set ns.s = ns.s|indent(ns.s, true, true) %}{% endfor %}{{ ns.s|length }}", ""},
		{"{{ ('&' * 20000000)|e|length }}", ""},
		{"{{ ('&' * 20000000)|upper|e|length }}", ""},
		{"{% set ns = namespace(l=['a']) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}", ""},
		{"{% set ns = namespace(l=['a' * 1000000]) %}{% for i in range(10) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l|string|length }}", ""},
		{"{% set ns = namespace(l=['a' * 1000000]) %}{% for i in range(10) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l|tojson|length }}", ""},
		{"{% set ns = namespace(s='a') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}", "1048576"},
	}
	for _, c := range cases {
		out, err := renderBounded(t, c.src)
		switch {
		case c.want == "" && !errors.Is(err, chattemplate.ErrRender):
			t.Errorf("Render(%q) = %.40q, %v; want an error wrapping ErrRender", c.src, out, err)
		case c.want != "" && (err != nil || out != c.want):
			t.Errorf("Render(%q) = %.80q, %v; want %q", c.src, out, err, c.want)
		}
	}
}
