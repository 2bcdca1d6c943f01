package chattemplate

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// getAttr is Jinja's obj.name: Python attributes (methods) first, then
// items.
func getAttr(obj value, name string) (value, error) {
	switch o := obj.(type) {
	case *undefined:
		return nil, fmt.Errorf("%w: '%s' is undefined", ErrRender, o.name)
	case *dict:
		if m := dictMethod(o, name); m != nil {
			return m, nil
		}
		if v, ok := o.m[name]; ok {
			return v, nil
		}
	case string:
		if m := strMethod(o, name); m != nil {
			return m, nil
		}
	case *list:
		if m := listMethod(o, name); m != nil {
			return m, nil
		}
	case *namespace:
		if v, ok := o.attrs.m[name]; ok {
			return v, nil
		}
	case *loopInfo:
		return o.attr(name), nil
	}
	return &undefined{name: typeName(obj) + " object has no attribute " + name}, nil
}

// getItem is Jinja's obj[key]: items first, then attributes.
func getItem(obj value, key value) (value, error) {
	switch o := obj.(type) {
	case *undefined:
		return nil, fmt.Errorf("%w: '%s' is undefined", ErrRender, o.name)
	case *dict:
		if k, ok := key.(string); ok {
			if v, ok := o.m[k]; ok {
				return v, nil
			}
		}
	case *list:
		if i, _, isInt, ok := number(key); ok && isInt {
			if i < 0 {
				i += int64(len(o.items))
			}
			if i >= 0 && i < int64(len(o.items)) {
				return o.items[i], nil
			}
			return &undefined{name: "list index out of range"}, nil
		}
	case string:
		if i, _, isInt, ok := number(key); ok && isInt {
			r := []rune(o)
			if i < 0 {
				i += int64(len(r))
			}
			if i >= 0 && i < int64(len(r)) {
				return string(r[i]), nil
			}
			return &undefined{name: "string index out of range"}, nil
		}
	}
	if k, ok := key.(string); ok {
		return getAttr(obj, k)
	}
	return &undefined{name: typeName(obj) + " has no item " + repr(key)}, nil
}

func (l *loopInfo) attr(name string) value {
	switch name {
	case "index":
		return int64(l.index0 + 1)
	case "index0":
		return int64(l.index0)
	case "revindex":
		return int64(l.length - l.index0)
	case "revindex0":
		return int64(l.length - l.index0 - 1)
	case "first":
		return l.index0 == 0
	case "last":
		return l.index0 == l.length-1
	case "length":
		return int64(l.length)
	case "previtem":
		if l.hasPrev {
			return l.prev
		}
		return &undefined{name: "there is no previous item"}
	case "nextitem":
		if l.hasNext {
			return l.next
		}
		return &undefined{name: "there is no next item"}
	case "cycle":
		return &callable{name: "cycle", fn: func(_ *renderer, args []value, _ *dict) (value, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("%w: no items for cycling given", ErrRender)
			}
			return args[l.index0%len(args)], nil
		}}
	}
	return &undefined{name: "loop has no attribute " + name}
}

func method(name string, fn func(args []value, kwargs *dict) (value, error)) *callable {
	return &callable{name: name, fn: func(_ *renderer, args []value, kwargs *dict) (value, error) { return fn(args, kwargs) }}
}

// argument returns positional argument i or keyword name, or def.
func argument(args []value, kwargs *dict, i int, name string, def value) value {
	if i < len(args) {
		return args[i]
	}
	if kwargs != nil {
		if v, ok := kwargs.m[name]; ok {
			return v
		}
	}
	return def
}

func dictMethod(d *dict, name string) *callable {
	switch name {
	case "items":
		return method(name, func([]value, *dict) (value, error) {
			out := &list{items: make([]value, len(d.keys))}
			for i, k := range d.keys {
				out.items[i] = &list{tuple: true, items: []value{k, d.m[k]}}
			}
			return out, nil
		})
	case "keys":
		return method(name, func([]value, *dict) (value, error) {
			out := &list{items: make([]value, len(d.keys))}
			for i, k := range d.keys {
				out.items[i] = k
			}
			return out, nil
		})
	case "values":
		return method(name, func([]value, *dict) (value, error) {
			out := &list{items: make([]value, len(d.keys))}
			for i, k := range d.keys {
				out.items[i] = d.m[k]
			}
			return out, nil
		})
	case "get":
		return method(name, func(args []value, kwargs *dict) (value, error) {
			k, ok := argument(args, kwargs, 0, "key", nil).(string)
			if ok {
				if v, ok := d.m[k]; ok {
					return v, nil
				}
			}
			return argument(args, kwargs, 1, "default", nil), nil
		})
	case "pop", "popitem", "setdefault", "update", "clear", "copy", "fromkeys":
		return unsafeMethod("dict", name)
	}
	return nil
}

func listMethod(l *list, name string) *callable {
	switch name {
	case "index":
		return method(name, func(args []value, _ *dict) (value, error) {
			for i, x := range l.items {
				if len(args) > 0 && equal(x, args[0]) {
					return int64(i), nil
				}
			}
			return nil, fmt.Errorf("%w: value is not in list", ErrRender)
		})
	case "count":
		return method(name, func(args []value, _ *dict) (value, error) {
			n := int64(0)
			for _, x := range l.items {
				if len(args) > 0 && equal(x, args[0]) {
					n++
				}
			}
			return n, nil
		})
	case "append", "extend", "insert", "pop", "remove", "sort", "reverse", "clear", "copy":
		return unsafeMethod("list", name)
	}
	return nil
}

// unsafeMethod stands for methods that modify their object, which the
// immutable sandbox of transformers refuses.
func unsafeMethod(typ, name string) *callable {
	return method(name, func([]value, *dict) (value, error) {
		return nil, fmt.Errorf("%w: access to attribute '%s' of '%s' object is unsafe", ErrRender, name, typ)
	})
}

func strArg(args []value, kwargs *dict, i int, name string) (string, bool, error) {
	v := argument(args, kwargs, i, name, nil)
	switch v := v.(type) {
	case nil:
		return "", false, nil
	case string:
		return v, true, nil
	}
	return "", false, fmt.Errorf("%w: argument %s must be str, not %s", ErrRender, name, typeName(v))
}

func intArg(args []value, kwargs *dict, i int, name string, def int64) (int64, error) {
	v := argument(args, kwargs, i, name, def)
	if n, _, isInt, ok := number(v); ok && isInt {
		return n, nil
	}
	if v == nil {
		return def, nil
	}
	return 0, fmt.Errorf("%w: argument %s must be an integer, not %s", ErrRender, name, typeName(v))
}

func pyStrip(s, chars string, hasChars, left, right bool) string {
	f := pyIsSpace
	if hasChars {
		f = func(r rune) bool { return strings.ContainsRune(chars, r) }
	}
	if left {
		s = strings.TrimLeftFunc(s, f)
	}
	if right {
		s = strings.TrimRightFunc(s, f)
	}
	return s
}

func strMethod(s string, name string) *callable {
	switch name {
	case "strip", "lstrip", "rstrip":
		return method(name, func(args []value, kwargs *dict) (value, error) {
			chars, has, err := strArg(args, kwargs, 0, "chars")
			if err != nil {
				return nil, err
			}
			return pyStrip(s, chars, has, name != "rstrip", name != "lstrip"), nil
		})
	case "startswith", "endswith":
		return method(name, func(args []value, kwargs *dict) (value, error) {
			var cands []value
			switch a := argument(args, kwargs, 0, "prefix", nil).(type) {
			case string:
				cands = []value{a}
			case *list:
				cands = a.items
			default:
				return nil, fmt.Errorf("%w: %s first arg must be str or a tuple of str", ErrRender, name)
			}
			for _, c := range cands {
				cs, ok := c.(string)
				if !ok {
					return nil, fmt.Errorf("%w: %s first arg must be str or a tuple of str", ErrRender, name)
				}
				if name == "startswith" && strings.HasPrefix(s, cs) || name == "endswith" && strings.HasSuffix(s, cs) {
					return true, nil
				}
			}
			return false, nil
		})
	case "upper":
		return method(name, func([]value, *dict) (value, error) { return pyUpper(s), nil })
	case "lower":
		return method(name, func([]value, *dict) (value, error) { return pyLower(s), nil })
	case "title":
		return method(name, func([]value, *dict) (value, error) { return pyTitle(s), nil })
	case "capitalize":
		return method(name, func([]value, *dict) (value, error) { return pyCapitalize(s), nil })
	case "split", "rsplit":
		return method(name, func(args []value, kwargs *dict) (value, error) {
			sep, has, err := strArg(args, kwargs, 0, "sep")
			if err != nil {
				return nil, err
			}
			maxSplit, err := intArg(args, kwargs, 1, "maxsplit", -1)
			if err != nil {
				return nil, err
			}
			if has && sep == "" {
				return nil, fmt.Errorf("%w: empty separator", ErrRender)
			}
			var parts []string
			switch {
			case !has && maxSplit < 0:
				parts = strings.FieldsFunc(s, pyIsSpace)
			case !has:
				parts = splitSpaceN(s, int(maxSplit), name == "rsplit")
			case maxSplit < 0:
				parts = strings.Split(s, sep)
			case name == "split":
				parts = strings.SplitN(s, sep, int(maxSplit)+1)
			default:
				parts = rsplitN(s, sep, int(maxSplit))
			}
			out := &list{items: make([]value, len(parts))}
			for i, p := range parts {
				out.items[i] = p
			}
			return out, nil
		})
	case "splitlines":
		return method(name, func([]value, *dict) (value, error) {
			out := &list{}
			for _, p := range strings.Split(strings.TrimSuffix(strings.ReplaceAll(s, "\r\n", "\n"), "\n"), "\n") {
				out.items = append(out.items, p)
			}
			if s == "" {
				out.items = nil
			}
			return out, nil
		})
	case "replace":
		return method(name, func(args []value, kwargs *dict) (value, error) {
			old, ok1, err1 := strArg(args, kwargs, 0, "old")
			nw, ok2, err2 := strArg(args, kwargs, 1, "new")
			if err1 != nil || err2 != nil || !ok1 || !ok2 {
				return nil, fmt.Errorf("%w: replace takes two strings", ErrRender)
			}
			n, err := intArg(args, kwargs, 2, "count", -1)
			if err != nil {
				return nil, err
			}
			return replaceBounded(s, old, nw, n)
		})
	case "find", "rfind", "count", "index":
		return method(name, func(args []value, kwargs *dict) (value, error) {
			sub, ok, err := strArg(args, kwargs, 0, "sub")
			if err != nil || !ok {
				return nil, fmt.Errorf("%w: %s takes a string", ErrRender, name)
			}
			var k int
			switch name {
			case "count":
				if sub == "" {
					return int64(runeLen(s) + 1), nil
				}
				return int64(strings.Count(s, sub)), nil
			case "rfind":
				k = strings.LastIndex(s, sub)
			default:
				k = strings.Index(s, sub)
			}
			if k < 0 {
				if name == "index" {
					return nil, fmt.Errorf("%w: substring not found", ErrRender)
				}
				return int64(-1), nil
			}
			return int64(runeLen(s[:k])), nil
		})
	case "join":
		return method(name, func(args []value, _ *dict) (value, error) {
			if len(args) != 1 {
				return nil, fmt.Errorf("%w: join takes one argument", ErrRender)
			}
			items, err := iterate(args[0])
			if err != nil {
				return nil, err
			}
			parts := make([]string, len(items))
			for i, it := range items {
				str, ok := it.(string)
				if !ok {
					return nil, fmt.Errorf("%w: sequence item %d: expected str instance, %s found", ErrRender, i, typeName(it))
				}
				parts[i] = str
			}
			return joinBounded(parts, s)
		})
	case "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "isnumeric", "isdecimal":
		return method(name, func([]value, *dict) (value, error) { return strPredicate(s, name), nil })
	case "zfill":
		return method(name, func(args []value, kwargs *dict) (value, error) {
			w, err := intArg(args, kwargs, 0, "width", 0)
			if err != nil {
				return nil, err
			}
			n := runeLen(s)
			if w <= int64(n) {
				return s, nil
			}
			if err := checkLen(int(min(w, maxOutput+1)) - n + len(s)); err != nil {
				return nil, err
			}
			sign := ""
			rest := s
			if strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") {
				sign, rest = s[:1], s[1:]
			}
			return sign + strings.Repeat("0", int(w)-n) + rest, nil
		})
	case "format", "format_map", "encode", "translate", "maketrans", "center", "ljust", "rjust", "expandtabs", "partition", "rpartition", "swapcase", "casefold", "removeprefix", "removesuffix":
		return method(name, func([]value, *dict) (value, error) {
			return nil, fmt.Errorf("%w: str.%s", ErrUnsupported, name)
		})
	}
	return nil
}

func strPredicate(s, name string) bool {
	if s == "" {
		return false
	}
	cased := false
	for _, r := range s {
		switch name {
		case "isdigit", "isdecimal", "isnumeric":
			if !unicode.IsDigit(r) && !(name == "isnumeric" && unicode.IsNumber(r)) {
				return false
			}
		case "isalpha":
			if !unicode.IsLetter(r) {
				return false
			}
		case "isalnum":
			if !unicode.IsLetter(r) && !unicode.IsNumber(r) {
				return false
			}
		case "isspace":
			if !pyIsSpace(r) {
				return false
			}
		case "islower":
			if unicode.IsUpper(r) || unicode.IsTitle(r) {
				return false
			}
			cased = cased || unicode.IsLower(r)
		case "isupper":
			if unicode.IsLower(r) || unicode.IsTitle(r) {
				return false
			}
			cased = cased || unicode.IsUpper(r)
		}
	}
	if name == "islower" || name == "isupper" {
		return cased
	}
	return true
}

func splitSpaceN(s string, n int, fromRight bool) []string {
	fields := strings.FieldsFunc(s, pyIsSpace)
	if n >= len(fields)-1 || n < 0 {
		return fields
	}
	if !fromRight {
		// The first n fields, then the rest with its leading space removed.
		rest := s
		var out []string
		for range n {
			rest = strings.TrimLeftFunc(rest, pyIsSpace)
			k := strings.IndexFunc(rest, pyIsSpace)
			out = append(out, rest[:k])
			rest = rest[k:]
		}
		return append(out, strings.TrimLeftFunc(rest, pyIsSpace))
	}
	rest := s
	var out []string
	for range n {
		rest = strings.TrimRightFunc(rest, pyIsSpace)
		k := strings.LastIndexFunc(rest, pyIsSpace)
		out = append([]string{rest[k+1:]}, out...)
		rest = rest[:k+1]
	}
	return append([]string{strings.TrimRightFunc(rest, pyIsSpace)}, out...)
}

func rsplitN(s, sep string, n int) []string {
	var out []string
	for range n {
		k := strings.LastIndex(s, sep)
		if k < 0 {
			break
		}
		out = append([]string{s[k+len(sep):]}, out...)
		s = s[:k]
	}
	return append([]string{s}, out...)
}

// global returns a built-in global function.
func (r *renderer) global(name string) (value, bool) {
	switch name {
	case "raise_exception":
		return &callable{name: name, fn: func(_ *renderer, args []value, kwargs *dict) (value, error) {
			return nil, &RaisedError{Message: toStr(argument(args, kwargs, 0, "message", ""))}
		}}, true
	case "strftime_now":
		return &callable{name: name, fn: func(r *renderer, args []value, kwargs *dict) (value, error) {
			f, ok, err := strArg(args, kwargs, 0, "format")
			if err != nil || !ok {
				return nil, fmt.Errorf("%w: strftime_now takes a format string", ErrRender)
			}
			return strftime(r.now(), f)
		}}, true
	case "namespace", "dict":
		return &callable{name: name, fn: func(_ *renderer, args []value, kwargs *dict) (value, error) {
			d := newDict()
			for _, a := range args {
				src, ok := a.(*dict)
				if !ok {
					return nil, fmt.Errorf("%w: %s() takes a dict or keyword arguments", ErrRender, name)
				}
				for _, k := range src.keys {
					d.set(k, src.m[k])
				}
			}
			if kwargs != nil {
				for _, k := range kwargs.keys {
					d.set(k, kwargs.m[k])
				}
			}
			if name == "dict" {
				return d, nil
			}
			return &namespace{attrs: d}, nil
		}}, true
	case "range":
		return &callable{name: name, fn: func(_ *renderer, args []value, _ *dict) (value, error) {
			var b [3]int64
			b[2] = 1
			for i, a := range args {
				n, _, isInt, ok := number(a)
				if !ok || !isInt || i > 2 {
					return nil, fmt.Errorf("%w: range() takes up to three integers", ErrRender)
				}
				b[i] = n
			}
			start, stop, step := b[0], b[1], b[2]
			if len(args) == 1 {
				start, stop = 0, b[0]
			}
			if step == 0 {
				return nil, fmt.Errorf("%w: range() arg 3 must not be zero", ErrRender)
			}
			out := &list{}
			for i := start; step > 0 && i < stop || step < 0 && i > stop; i += step {
				if len(out.items) >= maxRange {
					return nil, fmt.Errorf("%w: range too big", ErrRender)
				}
				out.items = append(out.items, i)
			}
			return out, nil
		}}, true
	}
	return nil, false
}

const maxRange = 1 << 20

// filterFunc implements a filter: arg | name(args, kwargs).
type filterFunc func(r *renderer, arg value, args []value, kwargs *dict) (value, error)

// filters is the table of built-in filters; it is never modified.
var filters = makeFilters()

func makeFilters() map[string]filterFunc {
	f := map[string]filterFunc{
		"tojson": func(_ *renderer, v value, args []value, kw *dict) (value, error) {
			o := jsonOptions{ensureASCII: truthy(argument(args, kw, 0, "ensure_ascii", false)), itemSep: ", ", keySep: ": "}
			switch ind := argument(args, kw, 1, "indent", nil).(type) {
			case nil:
			case int64:
				if ind > maxOutput {
					return nil, fmt.Errorf("%w: tojson indent wider than %d", ErrRender, maxOutput)
				}
				n := int(max(ind, 0))
				o.indent, o.indentStr, o.itemSep = &n, strings.Repeat(" ", n), ","
			case string:
				o.indentStr, o.itemSep = ind, ","
				n := 0
				o.indent = &n
			default:
				return nil, fmt.Errorf("%w: tojson indent must be an int or a string", ErrRender)
			}
			if sep, ok := argument(args, kw, 2, "separators", nil).(*list); ok {
				if len(sep.items) != 2 {
					return nil, fmt.Errorf("%w: tojson separators must be a pair", ErrRender)
				}
				a, ok1 := sep.items[0].(string)
				b, ok2 := sep.items[1].(string)
				if !ok1 || !ok2 {
					return nil, fmt.Errorf("%w: tojson separators must be strings", ErrRender)
				}
				o.itemSep, o.keySep = a, b
			}
			o.sortKeys = truthy(argument(args, kw, 3, "sort_keys", false))
			return toJSON(v, o)
		},
		"trim": func(_ *renderer, v value, args []value, kw *dict) (value, error) {
			chars, has, err := strArg(args, kw, 0, "chars")
			if err != nil {
				return nil, err
			}
			return pyStrip(toStr(v), chars, has, true, true), nil
		},
		"length": filterLength,
		"count":  filterLength,
		"string": func(_ *renderer, v value, _ []value, _ *dict) (value, error) { return toStr(v), nil },
		"list": func(_ *renderer, v value, _ []value, _ *dict) (value, error) {
			items, err := iterate(v)
			if err != nil {
				return nil, err
			}
			return &list{items: append([]value(nil), items...)}, nil
		},
		"join": func(_ *renderer, v value, args []value, kw *dict) (value, error) {
			items, err := iterate(v)
			if err != nil {
				return nil, err
			}
			sep := toStr(argument(args, kw, 0, "d", ""))
			attr := argument(args, kw, 1, "attribute", nil)
			parts := make([]string, len(items))
			for i, it := range items {
				if attr != nil {
					if it, err = getItem(it, attr); err != nil {
						return nil, err
					}
				}
				parts[i] = toStr(it)
			}
			return joinBounded(parts, sep)
		},
		"first": func(_ *renderer, v value, _ []value, _ *dict) (value, error) {
			items, err := iterate(v)
			if err != nil {
				return nil, err
			}
			if len(items) == 0 {
				return &undefined{name: "No first item, sequence was empty."}, nil
			}
			return items[0], nil
		},
		"last": func(_ *renderer, v value, _ []value, _ *dict) (value, error) {
			items, err := iterate(v)
			if err != nil {
				return nil, err
			}
			if len(items) == 0 {
				return &undefined{name: "No last item, sequence was empty."}, nil
			}
			return items[len(items)-1], nil
		},
		"upper":      func(_ *renderer, v value, _ []value, _ *dict) (value, error) { return pyUpper(toStr(v)), nil },
		"lower":      func(_ *renderer, v value, _ []value, _ *dict) (value, error) { return pyLower(toStr(v)), nil },
		"capitalize": func(_ *renderer, v value, _ []value, _ *dict) (value, error) { return pyCapitalize(toStr(v)), nil },
		"safe":       func(_ *renderer, v value, _ []value, _ *dict) (value, error) { return v, nil },
		"escape": func(_ *renderer, v value, _ []value, _ *dict) (value, error) {
			s := toStr(v)
			if err := checkLen(len(s) + 4*strings.Count(s, "&") + 3*(strings.Count(s, "<")+strings.Count(s, ">")) + 4*(strings.Count(s, `"`)+strings.Count(s, "'"))); err != nil {
				return nil, err
			}
			return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;").Replace(s), nil
		},
		"default": func(_ *renderer, v value, args []value, kw *dict) (value, error) {
			def := argument(args, kw, 0, "default_value", "")
			if isUndefined(v) || truthy(argument(args, kw, 1, "boolean", false)) && !truthy(v) {
				return def, nil
			}
			return v, nil
		},
		"items": func(_ *renderer, v value, _ []value, _ *dict) (value, error) {
			switch d := v.(type) {
			case *undefined:
				return &list{}, nil
			case *dict:
				return dictMethod(d, "items").fn(nil, nil, nil)
			}
			return nil, fmt.Errorf("%w: can only get item pairs from a mapping", ErrRender)
		},
		"selectattr": selectFilter(true, true),
		"rejectattr": selectFilter(true, false),
		"select":     selectFilter(false, true),
		"reject":     selectFilter(false, false),
		"map": func(r *renderer, v value, args []value, kw *dict) (value, error) {
			items, err := iterate(v)
			if err != nil {
				return nil, err
			}
			out := &list{}
			if kw != nil && hasKey(kw, "attribute") {
				attr := kw.m["attribute"]
				for _, it := range items {
					x, err := getItem(it, attr)
					if err != nil {
						return nil, err
					}
					if isUndefined(x) && hasKey(kw, "default") {
						x = kw.m["default"]
					}
					out.items = append(out.items, x)
				}
				return out, nil
			}
			if len(args) == 0 {
				return nil, fmt.Errorf("%w: map needs a filter name or attribute=", ErrRender)
			}
			name, ok := args[0].(string)
			fn, known := r.filters[name]
			if !ok || !known {
				return nil, fmt.Errorf("%w: filter %s in map", ErrUnsupported, repr(args[0]))
			}
			for _, it := range items {
				x, err := fn(r, it, args[1:], kw)
				if err != nil {
					return nil, err
				}
				out.items = append(out.items, x)
			}
			return out, nil
		},
		"int": func(_ *renderer, v value, args []value, kw *dict) (value, error) {
			def := argument(args, kw, 0, "default", int64(0))
			switch x := v.(type) {
			case int64, bigInt:
				return x, nil
			case bool:
				return b2i(x), nil
			case float64:
				if math.IsNaN(x) || math.IsInf(x, 0) {
					return def, nil
				}
				return int64(x), nil
			case string:
				if n, err := strconv.ParseInt(strings.TrimSpace(strings.ReplaceAll(x, "_", "")), 10, 64); err == nil {
					return n, nil
				}
				if f, err := strconv.ParseFloat(strings.TrimSpace(x), 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
					return int64(f), nil
				}
			}
			return def, nil
		},
		"float": func(_ *renderer, v value, args []value, kw *dict) (value, error) {
			def := argument(args, kw, 0, "default", 0.0)
			if _, f, _, ok := number(v); ok {
				return f, nil
			}
			if b, ok := v.(bigInt); ok {
				f, _ := strconv.ParseFloat(string(b), 64)
				return f, nil
			}
			if s, ok := v.(string); ok {
				if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
					return f, nil
				}
			}
			return def, nil
		},
		"abs": func(_ *renderer, v value, _ []value, _ *dict) (value, error) {
			switch x := v.(type) {
			case int64:
				if x < 0 {
					return -x, nil
				}
				return x, nil
			case bool:
				return b2i(x), nil
			case float64:
				return math.Abs(x), nil
			case bigInt:
				return bigInt(strings.TrimPrefix(string(x), "-")), nil
			}
			return nil, fmt.Errorf("%w: bad operand type for abs(): '%s'", ErrRender, typeName(v))
		},
		"replace": func(_ *renderer, v value, args []value, kw *dict) (value, error) {
			if len(args) < 2 {
				return nil, fmt.Errorf("%w: replace takes old and new", ErrRender)
			}
			n, err := intArg(args, kw, 2, "count", -1)
			if err != nil {
				return nil, err
			}
			return replaceBounded(toStr(v), toStr(args[0]), toStr(args[1]), n)
		},
		"reverse": func(_ *renderer, v value, _ []value, _ *dict) (value, error) {
			if s, ok := v.(string); ok {
				r := []rune(s)
				for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
					r[i], r[j] = r[j], r[i]
				}
				return string(r), nil
			}
			items, err := iterate(v)
			if err != nil {
				return nil, err
			}
			out := &list{items: make([]value, len(items))}
			for i, it := range items {
				out.items[len(items)-1-i] = it
			}
			return out, nil
		},
		"sort": func(_ *renderer, v value, args []value, kw *dict) (value, error) {
			items, err := iterate(v)
			if err != nil {
				return nil, err
			}
			rev := truthy(argument(args, kw, 0, "reverse", false))
			cs := truthy(argument(args, kw, 1, "case_sensitive", false))
			attr := argument(args, kw, 2, "attribute", nil)
			keys := make([]value, len(items))
			for i, it := range items {
				k := it
				if attr != nil {
					if k, err = getItem(it, attr); err != nil {
						return nil, err
					}
				}
				if s, ok := k.(string); ok && !cs {
					k = pyLower(s)
				}
				keys[i] = k
			}
			idx := make([]int, len(items))
			for i := range idx {
				idx[i] = i
			}
			var cmpErr error
			sort.SliceStable(idx, func(a, b int) bool {
				c, err := compare(keys[idx[a]], keys[idx[b]])
				if err != nil {
					cmpErr = err
				}
				if rev {
					return c > 0
				}
				return c < 0
			})
			if cmpErr != nil {
				return nil, cmpErr
			}
			out := &list{items: make([]value, len(items))}
			for i, k := range idx {
				out.items[i] = items[k]
			}
			return out, nil
		},
		"unique": func(_ *renderer, v value, _ []value, _ *dict) (value, error) {
			items, err := iterate(v)
			if err != nil {
				return nil, err
			}
			out := &list{}
			for _, it := range items {
				seen := false
				for _, o := range out.items {
					a, b := it, o
					if s, ok := a.(string); ok {
						a = pyLower(s)
					}
					if s, ok := b.(string); ok {
						b = pyLower(s)
					}
					seen = seen || equal(a, b)
				}
				if !seen {
					out.items = append(out.items, it)
				}
			}
			return out, nil
		},
		"indent": func(_ *renderer, v value, args []value, kw *dict) (value, error) {
			width := argument(args, kw, 0, "width", int64(4))
			ind := ""
			switch w := width.(type) {
			case int64:
				if w > maxOutput {
					return nil, fmt.Errorf("%w: indent wider than %d", ErrRender, maxOutput)
				}
				ind = strings.Repeat(" ", int(max(w, 0)))
			case string:
				ind = w
			}
			first := truthy(argument(args, kw, 1, "first", false))
			blank := truthy(argument(args, kw, 2, "blank", false))
			s := toStr(v)
			lines := strings.Split(s, "\n")
			if err := checkLen(len(s) + len(ind)*min(len(lines), maxOutput)); err != nil {
				return nil, err
			}
			for i, l := range lines {
				if i == 0 && !first || !blank && strings.TrimSpace(l) == "" && i > 0 {
					continue
				}
				if i == 0 && first && !blank && l == "" {
					continue
				}
				lines[i] = ind + l
			}
			return strings.Join(lines, "\n"), nil
		},
		"wordcount": func(_ *renderer, v value, _ []value, _ *dict) (value, error) {
			return int64(len(strings.FieldsFunc(toStr(v), func(r rune) bool {
				// Python's \w: str.isalnum (letters and every kind of
				// number) and the underscore.
				return !(unicode.IsLetter(r) || unicode.IsNumber(r) || r == '_')
			}))), nil
		},
		"title": func(_ *renderer, v value, _ []value, _ *dict) (value, error) { return jinjaTitle(toStr(v)), nil },
	}
	f["d"] = f["default"]
	f["e"] = f["escape"]
	return f
}

// replaceBounded is strings.Replace with Python's count (negative means
// all), refusing a result longer than maxOutput.
func replaceBounded(s, old, nw string, count int64) (value, error) {
	if growth := len(nw) - len(old); growth > 0 {
		n := int64(strings.Count(s, old))
		if old == "" {
			n = int64(runeLen(s) + 1)
		}
		if count >= 0 {
			n = min(n, count)
		}
		if n > maxOutput/int64(growth) {
			return nil, errTooLong
		}
		if err := checkLen(len(s) + int(n)*growth); err != nil {
			return nil, err
		}
	}
	return strings.Replace(s, old, nw, int(max(count, -1))), nil
}

// joinBounded is strings.Join, refusing a result longer than maxOutput.
func joinBounded(parts []string, sep string) (value, error) {
	n := len(sep) * max(len(parts)-1, 0)
	if len(sep) > 0 && len(parts) > maxOutput/len(sep) {
		return nil, errTooLong
	}
	for _, p := range parts {
		if n += len(p); n > maxOutput {
			return nil, checkLen(n)
		}
	}
	return strings.Join(parts, sep), nil
}

func filterLength(_ *renderer, v value, _ []value, _ *dict) (value, error) {
	switch x := v.(type) {
	case string:
		return int64(runeLen(x)), nil
	case *list:
		return int64(len(x.items)), nil
	case *dict:
		return int64(len(x.keys)), nil
	case *undefined:
		return int64(0), nil
	}
	return nil, fmt.Errorf("%w: object of type '%s' has no len()", ErrRender, typeName(v))
}

func selectFilter(byAttr, keep bool) filterFunc {
	return func(_ *renderer, v value, args []value, _ *dict) (value, error) {
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		var attr value
		if byAttr {
			if len(args) == 0 {
				return nil, fmt.Errorf("%w: missing attribute", ErrRender)
			}
			attr, args = args[0], args[1:]
		}
		test := func(x value) (bool, error) { return truthy(x), nil }
		if len(args) > 0 {
			name, ok := args[0].(string)
			t, known := tests[name]
			if !ok || !known {
				return nil, fmt.Errorf("%w: test %s", ErrUnsupported, repr(args[0]))
			}
			rest := args[1:]
			test = func(x value) (bool, error) { return t(x, rest) }
		}
		out := &list{}
		for _, it := range items {
			x := it
			if byAttr {
				if x, err = getItem(it, attr); err != nil {
					return nil, err
				}
			}
			ok, err := test(x)
			if err != nil {
				return nil, err
			}
			if ok == keep {
				out.items = append(out.items, it)
			}
		}
		return out, nil
	}
}

type testFunc func(v value, args []value) (bool, error)

// tests is the table of built-in tests; it is never modified.
var tests = makeTests()

func makeTests() map[string]testFunc {
	cmp := func(op string) testFunc {
		return func(v value, args []value) (bool, error) {
			if len(args) != 1 {
				return false, fmt.Errorf("%w: test takes one argument", ErrRender)
			}
			r, err := binary(op, v, args[0])
			if err != nil {
				return false, err
			}
			return r.(bool), nil
		}
	}
	t := map[string]testFunc{
		"defined":   func(v value, _ []value) (bool, error) { return !isUndefined(v), nil },
		"undefined": func(v value, _ []value) (bool, error) { return isUndefined(v), nil },
		"none":      func(v value, _ []value) (bool, error) { return v == nil, nil },
		"boolean":   func(v value, _ []value) (bool, error) { _, ok := v.(bool); return ok, nil },
		"true":      func(v value, _ []value) (bool, error) { b, ok := v.(bool); return ok && b, nil },
		"false":     func(v value, _ []value) (bool, error) { b, ok := v.(bool); return ok && !b, nil },
		"integer": func(v value, _ []value) (bool, error) {
			switch v.(type) {
			case int64, bigInt:
				return true, nil
			}
			return false, nil
		},
		"float": func(v value, _ []value) (bool, error) { _, ok := v.(float64); return ok, nil },
		"number": func(v value, _ []value) (bool, error) {
			_, _, _, ok := number(v)
			_, big := v.(bigInt)
			return ok || big, nil
		},
		"string":  func(v value, _ []value) (bool, error) { _, ok := v.(string); return ok, nil },
		"mapping": func(v value, _ []value) (bool, error) { _, ok := v.(*dict); return ok, nil },
		"iterable": func(v value, _ []value) (bool, error) {
			switch v.(type) {
			case string, *list, *dict, *undefined:
				return true, nil
			}
			return false, nil
		},
		"sequence": func(v value, _ []value) (bool, error) {
			switch v.(type) {
			case string, *list, *dict:
				return true, nil
			}
			return false, nil
		},
		"callable": func(v value, _ []value) (bool, error) {
			switch v.(type) {
			case *callable, *macro:
				return true, nil
			}
			return false, nil
		},
		"sameas": func(v value, args []value) (bool, error) {
			if len(args) != 1 {
				return false, fmt.Errorf("%w: sameas takes one argument", ErrRender)
			}
			switch a := v.(type) {
			case nil, bool:
				return v == args[0], nil
			case *list:
				b, ok := args[0].(*list)
				return ok && a == b, nil
			case *dict:
				b, ok := args[0].(*dict)
				return ok && a == b, nil
			}
			return false, nil
		},
		"eq": cmp("=="), "equalto": cmp("=="), "==": cmp("=="),
		"ne": cmp("!="), "!=": cmp("!="),
		"lt": cmp("<"), "lessthan": cmp("<"), "<": cmp("<"),
		"le": cmp("<="), "<=": cmp("<="),
		"gt": cmp(">"), "greaterthan": cmp(">"), ">": cmp(">"),
		"ge": cmp(">="), ">=": cmp(">="),
		"in": func(v value, args []value) (bool, error) {
			if len(args) != 1 {
				return false, fmt.Errorf("%w: in takes one argument", ErrRender)
			}
			return containsValue(args[0], v)
		},
		"odd": func(v value, _ []value) (bool, error) {
			if b, ok := v.(bigInt); ok {
				return (b[len(b)-1]-'0')%2 == 1, nil
			}
			n, _, isInt, ok := number(v)
			if !ok || !isInt {
				return false, fmt.Errorf("%w: odd needs an integer", ErrRender)
			}
			return n%2 != 0, nil
		},
		"even": func(v value, _ []value) (bool, error) {
			if b, ok := v.(bigInt); ok {
				return (b[len(b)-1]-'0')%2 == 0, nil
			}
			n, _, isInt, ok := number(v)
			if !ok || !isInt {
				return false, fmt.Errorf("%w: even needs an integer", ErrRender)
			}
			return n%2 == 0, nil
		},
		"divisibleby": func(v value, args []value) (bool, error) {
			if len(args) != 1 {
				return false, fmt.Errorf("%w: divisibleby takes one argument", ErrRender)
			}
			r, err := binary("%", v, args[0])
			if err != nil {
				return false, err
			}
			return equal(r, int64(0)), nil
		},
		"lower":   func(v value, _ []value) (bool, error) { return pyIsLower(toStr(v)), nil },
		"upper":   func(v value, _ []value) (bool, error) { return pyIsUpper(toStr(v)), nil },
		"escaped": func(value, []value) (bool, error) { return false, nil },
	}
	return t
}
