package chattemplate_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/kvroute/kvroute/chattemplate"
)

// TestJSONIntegersBeyond64Bits: integers in JSON variables (messages,
// tools) that do not fit in int64 keep their digits, as Python's json
// does: they print, compare, sort and serialize as transformers' jinja2
// renders them (the wanted outputs are jinja2's), and arithmetic on them
// is refused rather than done inexactly.
func TestJSONIntegersBeyond64Bits(t *testing.T) {
	args := json.RawMessage(`{"id": 12345678901234567890, "neg": -9223372036854775809, "default": 10000000000000000000000, "small": 9223372036854775807, "f": 1.5e300, "e": 12345678901234567890e0}`)
	cases := []struct {
		src, want string
		err       error
		keyOrder  bool // the output shows the keys' order, which a Go map has not
	}{
		{src: "{{ args|tojson }} {{ args.id }}",
			want: `{"id": 12345678901234567890, "neg": -9223372036854775809, "default": 10000000000000000000000, "small": 9223372036854775807, "f": 1.5e+300, "e": 1.2345678901234567e+19} 12345678901234567890`, keyOrder: true},
		{src: "{{ args.id is integer }} {{ args.id is number }} {{ args.id == args.id }} {{ args.id == args.small }} {{ args.id != args.e }} {{ args.default == 1e22 }} {{ args.id in [1, args.id] }}",
			want: "True True True False True True True"},
		{src: "{{ -args.id }} {{ args.neg|abs }} {{ args.id|string|length }} {{ args.id > 1 }} {{ args.id < 1.0e30 }} {{ [args.id, 1, args.neg, 2.5]|sort }} {{ args.id|float }} {{ args.id|int }} {{ args.id is odd }} {{ args.default is even }} {{ args }} {{ args.id ~ '' }} {{ [args.neg]|tojson(indent=1) }} {{ args.id|tojson }}",
			want: "-12345678901234567890 9223372036854775809 20 True True [-9223372036854775809, 1, 2.5, 12345678901234567890] 1.2345678901234567e+19 12345678901234567890 False True {'id': 12345678901234567890, 'neg': -9223372036854775809, 'default': 10000000000000000000000, 'small': 9223372036854775807, 'f': 1.5e+300, 'e': 1.2345678901234567e+19} 12345678901234567890 [\n -9223372036854775809\n] 12345678901234567890", keyOrder: true},
		{src: "{{ args.id + 1 }}", err: chattemplate.ErrUnsupported},
		{src: "{{ args.id * 2 }}", err: chattemplate.ErrUnsupported},
	}
	for _, vars := range []map[string]any{
		{"args": args},
		{"args": map[string]any{"id": json.Number("12345678901234567890"), "neg": json.Number("-9223372036854775809"), "default": json.Number("10000000000000000000000"),
			"small": json.Number("9223372036854775807"), "f": json.Number("1.5e300"), "e": json.Number("12345678901234567890e0")}},
	} {
		for _, c := range cases {
			if _, raw := vars["args"].(json.RawMessage); c.keyOrder && !raw {
				continue
			}
			tmpl, err := chattemplate.Parse(c.src)
			if err != nil {
				t.Fatalf("Parse(%q): %v", c.src, err)
			}
			out, err := tmpl.Render(vars, chattemplate.Options{})
			switch {
			case c.err != nil && !errors.Is(err, c.err):
				t.Errorf("Render(%q) = %q, %v; want an error wrapping %v", c.src, out, err, c.err)
			case c.err == nil && (err != nil || out != c.want):
				t.Errorf("Render(%q) =\n %q, %v; want\n %q", c.src, out, err, c.want)
			}
		}
	}
}
