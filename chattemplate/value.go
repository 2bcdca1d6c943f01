package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/kvroute/kvroute/internal/jsonread"
)

// Values a template computes with, modelled on Python's:
//
//	nil        None
//	undefined  Jinja's Undefined (prints nothing, fails on use)
//	bool, int64, float64, string
//	bigInt     an int beyond 64 bits read from JSON, kept as its digits
//	*list      list or tuple
//	*dict      dict, keeping insertion order as Python does
//	*namespace, *loopInfo, *macro, *callable
type value = any

type undefined struct{ name string }

// bigInt is an integer read from JSON that does not fit in int64, as its
// decimal digits (a JSON integer literal: an optional minus sign, no
// leading zeros). Python keeps such integers exactly, so they print,
// compare and serialize as written; arithmetic on them is refused.
type bigInt string

// bigIntLiteral reports whether a JSON number literal is an integer (no
// fraction, no exponent).
func bigIntLiteral(raw string) bool { return !strings.ContainsAny(raw, ".eE") }

// negate is -b.
func (b bigInt) negate() bigInt {
	if strings.HasPrefix(string(b), "-") {
		return b[1:]
	}
	return "-" + b
}

// bigNumber reads an int, float, bool or bigInt as an exact big.Float,
// for comparisons with a bigInt. NaN and infinities are not read.
func bigNumber(v value) (*big.Float, bool) {
	if b, ok := v.(bigInt); ok {
		i, ok := new(big.Int).SetString(string(b), 10)
		if !ok {
			return nil, false
		}
		return new(big.Float).SetInt(i), true
	}
	i, f, isInt, ok := number(v)
	switch {
	case !ok:
		return nil, false
	case isInt:
		return new(big.Float).SetInt64(i), true
	case math.IsNaN(f) || math.IsInf(f, 0):
		return nil, false
	}
	return new(big.Float).SetFloat64(f), true
}

type list struct {
	items []value
	tuple bool
}

type dict struct {
	keys []string
	m    map[string]value
}

func newDict() *dict { return &dict{m: map[string]value{}} }

func (d *dict) set(k string, v value) {
	if _, ok := d.m[k]; !ok {
		d.keys = append(d.keys, k)
	}
	d.m[k] = v
}

type namespace struct{ attrs *dict }

// callable is a built-in function or bound method.
type callable struct {
	name string
	fn   func(r *renderer, args []value, kwargs *dict) (value, error)
}

type macro struct {
	node  *macroNode
	scope *scope // where it was defined
}

type loopInfo struct {
	index0, length int
	prev, next     value
	hasPrev        bool
	hasNext        bool
}

func isUndefined(v value) bool { _, ok := v.(*undefined); return ok }

func typeName(v value) string {
	switch v := v.(type) {
	case nil:
		return "NoneType"
	case *undefined:
		return "Undefined"
	case bool:
		return "bool"
	case int64, bigInt:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case *list:
		if v.tuple {
			return "tuple"
		}
		return "list"
	case *dict:
		return "dict"
	case *namespace:
		return "Namespace"
	case *loopInfo:
		return "LoopContext"
	case *macro:
		return "Macro"
	case *callable:
		return "builtin_function_or_method"
	}
	return fmt.Sprintf("%T", v)
}

func truthy(v value) bool {
	switch v := v.(type) {
	case nil, *undefined:
		return false
	case bool:
		return v
	case int64:
		return v != 0
	case float64:
		return v != 0
	case string:
		return v != ""
	case *list:
		return len(v.items) > 0
	case *dict:
		return len(v.keys) > 0
	}
	return true
}

// toStr is Python's str() (Jinja prints undefined as "").
func toStr(v value) string {
	switch v := v.(type) {
	case nil:
		return "None"
	case *undefined:
		return ""
	case string:
		return v
	case bool:
		if v {
			return "True"
		}
		return "False"
	case int64:
		return strconv.FormatInt(v, 10)
	case bigInt:
		return string(v)
	case float64:
		return pyFloat(v)
	case *namespace:
		return "<Namespace " + repr(v.attrs) + ">"
	}
	return repr(v)
}

// repr is Python's repr(). A repr longer than maxOutput is cut short
// somewhere past maxOutput bytes (its length is what matters then: it is
// refused as too long wherever it goes).
func repr(v value) string {
	switch v.(type) {
	case *list, *dict:
		var b strings.Builder
		writeRepr(&b, v)
		return b.String()
	}
	return reprScalar(v)
}

// writeRepr writes repr(v) to b, stopping once b holds more than
// maxOutput bytes.
func writeRepr(b *strings.Builder, v value) {
	switch v := v.(type) {
	case *list:
		open, end := "[", "]"
		if v.tuple {
			open, end = "(", ")"
			if len(v.items) == 1 {
				end = ",)"
			}
		}
		b.WriteString(open)
		for i, it := range v.items {
			if b.Len() > maxOutput {
				return
			}
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, it)
		}
		b.WriteString(end)
	case *dict:
		b.WriteString("{")
		for i, k := range v.keys {
			if b.Len() > maxOutput {
				return
			}
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyRepr(k))
			b.WriteString(": ")
			writeRepr(b, v.m[k])
		}
		b.WriteString("}")
	default:
		b.WriteString(reprScalar(v))
	}
}

// reprScalar is repr() of a value other than a list or dict.
func reprScalar(v value) string {
	switch v := v.(type) {
	case string:
		return pyRepr(v)
	case *undefined:
		return "Undefined"
	case *callable:
		return "<built-in method " + v.name + ">"
	case *macro:
		return "<Macro '" + v.node.name + "'>"
	case *loopInfo:
		return "<LoopContext>"
	}
	return toStr(v)
}

// pyFloat formats a float as Python's repr does: the shortest digits that
// read back, in positional notation for exponents from -4 to 15.
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	if exp < -4 || exp >= 16 {
		if !strings.Contains(mant, ".") {
			return mant + "e" + fmt.Sprintf("%+03d", exp)
		}
		return mant + "e" + fmt.Sprintf("%+03d", exp)
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// pyRepr quotes a string as Python's repr does.
func pyRepr(s string) string {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte(q)
	for s != "" {
		n := plainASCII(s, q)
		b.WriteString(s[:n])
		if s = s[n:]; s == "" {
			break
		}
		r, size := utf8.DecodeRuneInString(s)
		s = s[size:]
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r >= 0x80 && !isPrintable(r):
			switch {
			case r <= 0xff:
				fmt.Fprintf(&b, `\x%02x`, r)
			case r <= 0xffff:
				fmt.Fprintf(&b, `\u%04x`, r)
			default:
				fmt.Fprintf(&b, `\U%08x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// isPrintable approximates Python's str.isprintable for one character:
// not a separator other than the space, and not Other (Cc, Cf, Cs, Co, Cn).
func isPrintable(r rune) bool {
	if r == ' ' {
		return true
	}
	if unicode.Is(unicode.Z, r) || unicode.Is(unicode.C, r) {
		return false
	}
	return unicode.IsPrint(r) || unicode.IsGraphic(r)
}

// jsonOptions are the arguments of transformers' tojson filter, which
// calls json.dumps.
type jsonOptions struct {
	ensureASCII bool
	indent      *int
	indentStr   string
	itemSep     string
	keySep      string
	sortKeys    bool
}

func toJSON(v value, o jsonOptions) (string, error) {
	var b strings.Builder
	if err := writeJSON(&b, v, o, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeJSON(b *strings.Builder, v value, o jsonOptions, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%w: tojson nesting too deep", ErrRender)
	}
	if b.Len() > maxOutput {
		return fmt.Errorf("%w: tojson output longer than %d bytes", ErrRender, maxOutput)
	}
	nl := func(d int) {
		if o.indent != nil || o.indentStr != "" {
			b.WriteByte('\n')
			for range d {
				b.WriteString(o.indentStr)
			}
		}
	}
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if v {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case bigInt:
		b.WriteString(string(v))
	case float64:
		switch {
		case math.IsInf(v, 1):
			b.WriteString("Infinity")
		case math.IsInf(v, -1):
			b.WriteString("-Infinity")
		case math.IsNaN(v):
			b.WriteString("NaN")
		default:
			b.WriteString(pyFloat(v))
		}
	case string:
		writeJSONString(b, v, o.ensureASCII)
	case *list:
		if len(v.items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range v.items {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			nl(depth + 1)
			if err := writeJSON(b, it, o, depth+1); err != nil {
				return err
			}
		}
		nl(depth)
		b.WriteByte(']')
	case *dict:
		if len(v.keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := v.keys
		if o.sortKeys {
			keys = append([]string(nil), keys...)
			sort.Strings(keys)
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			nl(depth + 1)
			writeJSONString(b, k, o.ensureASCII)
			b.WriteString(o.keySep)
			if err := writeJSON(b, v.m[k], o, depth+1); err != nil {
				return err
			}
		}
		nl(depth)
		b.WriteByte('}')
	default:
		return fmt.Errorf("%w: Object of type %s is not JSON serializable", ErrRender, typeName(v))
	}
	return nil
}

// plainASCII is the length of the leading run of s made of printable
// ASCII other than the quote q and the backslash, which repr and tojson
// copy as they are.
func plainASCII(s string, q byte) int {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == q || c == '\\' {
			return i
		}
	}
	return len(s)
}

func writeJSONString(b *strings.Builder, s string, ascii bool) {
	b.WriteByte('"')
	for s != "" {
		n := plainASCII(s, '"')
		b.WriteString(s[:n])
		if s = s[n:]; s == "" {
			break
		}
		r, size := utf8.DecodeRuneInString(s)
		s = s[size:]
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				fmt.Fprintf(b, `\u%04x`, r)
			case ascii && r > 0x7e:
				if r > 0xffff {
					r -= 0x10000
					fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
				} else {
					fmt.Fprintf(b, `\u%04x`, r)
				}
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// maxDepth bounds nesting of values, recursion and loops' depth.
const maxDepth = 512

// fromJSON decodes JSON into template values, keeping object key order.
// As encoding/json does, it accepts duplicate object keys (the last one
// wins) and replaces invalid UTF-8 in strings with U+FFFD.
func fromJSON(data []byte) (value, error) {
	d := jsonread.NewDecoder(data)
	v, err := decodeJSON(d, 0)
	if err != nil {
		return nil, err
	}
	if _, err := d.ReadToken(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after JSON value", ErrInput)
	}
	return v, nil
}

func decodeJSON(d *jsontext.Decoder, depth int) (value, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("%w: JSON nesting too deep", ErrInput)
	}
	if d.PeekKind() == '0' {
		raw, err := d.ReadValue()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInput, err)
		}
		i, err := strconv.ParseInt(string(raw), 10, 64)
		if err == nil {
			return i, nil
		}
		if errors.Is(err, strconv.ErrRange) && bigIntLiteral(string(raw)) {
			return bigInt(raw), nil
		}
		f, err := strconv.ParseFloat(string(raw), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return nil, fmt.Errorf("%w: number %s", ErrInput, raw)
		}
		return f, nil
	}
	t, err := d.ReadToken()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	switch t.Kind() {
	case '[':
		l := &list{}
		for d.PeekKind() != ']' {
			v, err := decodeJSON(d, depth+1)
			if err != nil {
				return nil, err
			}
			l.items = append(l.items, v)
		}
		if _, err := d.ReadToken(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInput, err)
		}
		return l, nil
	case '{':
		m := newDict()
		for d.PeekKind() != '}' {
			k, err := d.ReadToken()
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInput, err)
			}
			key := k.String() // before the next read voids k
			v, err := decodeJSON(d, depth+1)
			if err != nil {
				return nil, err
			}
			m.set(key, v)
		}
		if _, err := d.ReadToken(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInput, err)
		}
		return m, nil
	case '"':
		return t.String(), nil
	case 't', 'f':
		return t.Bool(), nil
	case 'n':
		return nil, nil
	}
	return nil, fmt.Errorf("%w: unexpected JSON token %v", ErrInput, t)
}

// fromGo converts Go values given to Render. Maps are read in sorted key
// order (Go maps have none); pass json.RawMessage to keep an order.
func fromGo(v any, depth int) (value, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("%w: value nesting too deep", ErrInput)
	}
	switch v := v.(type) {
	case nil, bool, string, int64, float64:
		return v, nil
	case int:
		return int64(v), nil
	case int32:
		return int64(v), nil
	case uint32:
		return int64(v), nil
	case float32:
		return float64(v), nil
	case json.Number:
		i, err := v.Int64()
		if err == nil {
			return i, nil
		}
		if errors.Is(err, strconv.ErrRange) && bigIntLiteral(string(v)) {
			if b, ok := new(big.Int).SetString(string(v), 10); ok {
				return bigInt(b.String()), nil
			}
		}
		f, err := v.Float64()
		if err != nil {
			return nil, fmt.Errorf("%w: number %s", ErrInput, v)
		}
		return f, nil
	case json.RawMessage:
		return fromJSON(v)
	case []any:
		l := &list{items: make([]value, len(v))}
		for i, it := range v {
			x, err := fromGo(it, depth+1)
			if err != nil {
				return nil, err
			}
			l.items[i] = x
		}
		return l, nil
	case []string:
		l := &list{items: make([]value, len(v))}
		for i, it := range v {
			l.items[i] = it
		}
		return l, nil
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := newDict()
		for _, k := range keys {
			x, err := fromGo(v[k], depth+1)
			if err != nil {
				return nil, err
			}
			d.set(k, x)
		}
		return d, nil
	}
	return nil, fmt.Errorf("%w: unsupported Go value of type %T", ErrInput, v)
}

// runeLen is len() of a string in characters.
func runeLen(s string) int { return utf8.RuneCountInString(s) }
