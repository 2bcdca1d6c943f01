package chattemplate

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

type scope struct {
	vars   map[string]value
	parent *scope
}

func (s *scope) lookup(name string) (value, bool) {
	for c := s; c != nil; c = c.parent {
		if v, ok := c.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

type renderer struct {
	filters map[string]filterFunc
	out     strings.Builder
	now     func() time.Time
	depth   int
	steps   int
	limit   int
}

var (
	errBreak    = errors.New("break")
	errContinue = errors.New("continue")
)

func (r *renderer) tick() error {
	r.steps++
	if r.steps > r.limit {
		return fmt.Errorf("%w: more than %d steps", ErrRender, r.limit)
	}
	return nil
}

// emit appends s to the output, refusing output longer than maxOutput
// before it grows the buffer, so that a rendering never holds more.
func (r *renderer) emit(s string) error {
	if len(s) > maxOutput-r.out.Len() {
		return fmt.Errorf("%w: output longer than %d bytes", ErrRender, maxOutput)
	}
	r.out.WriteString(s)
	return nil
}

// maxOutput bounds a rendering's length and that of every string a
// rendering builds.
const maxOutput = 64 << 20

// maxItems bounds the length of lists a rendering builds.
const maxItems = 1 << 20

// refuseBigInt refuses arithmetic on an integer beyond 64 bits read from
// JSON: this package cannot compute it exactly as Python would.
func refuseBigInt(op string, l, r value) error {
	for _, v := range []value{l, r} {
		if b, ok := v.(bigInt); ok {
			return fmt.Errorf("%w: arithmetic (%s) on the integer %s, beyond 64 bits", ErrUnsupported, op, b)
		}
	}
	return nil
}

// errIntOverflow is the error of integer arithmetic whose result does not
// fit in 64 bits (Python would go on with a big integer).
var errIntOverflow = fmt.Errorf("%w: integer result does not fit in 64 bits", ErrRender)

// concat joins two strings, refusing a result longer than maxOutput.
func concat(a, b string) (value, error) {
	if err := checkLen(len(a) + len(b)); err != nil {
		return nil, err
	}
	return a + b, nil
}

// errTooLong refuses a string longer than maxOutput.
var errTooLong = fmt.Errorf("%w: string longer than %d bytes", ErrRender, maxOutput)

// checkLen refuses a string of n bytes longer than maxOutput.
func checkLen(n int) error {
	if n > maxOutput {
		return errTooLong
	}
	return nil
}

// addInt is a + b, refusing a result beyond 64 bits.
func addInt(a, b int64) (value, error) {
	s := a + b
	if (s > a) != (b > 0) {
		return nil, errIntOverflow
	}
	return s, nil
}

// mulInt is a * b, refusing a result beyond 64 bits.
func mulInt(a, b int64) (value, error) {
	if a == 0 || b == 0 {
		return int64(0), nil
	}
	p := a * b
	if p/b != a || (a == -1 && b == math.MinInt64) || (b == -1 && a == math.MinInt64) {
		return nil, errIntOverflow
	}
	return p, nil
}

// powInt is base ** exp for exp >= 0 by repeated squaring, refusing a
// result beyond 64 bits. It takes at most about 64 multiplications
// whatever the exponent.
func powInt(base, exp int64) (value, error) {
	switch base {
	case 0:
		if exp == 0 {
			return int64(1), nil
		}
		return int64(0), nil
	case 1:
		return int64(1), nil
	case -1:
		if exp%2 == 0 {
			return int64(1), nil
		}
		return int64(-1), nil
	}
	if exp >= 64 { // |base| >= 2
		return nil, errIntOverflow
	}
	result, sq := int64(1), base
	for {
		if exp&1 == 1 {
			p, err := mulInt(result, sq)
			if err != nil {
				return nil, err
			}
			result = p.(int64)
		}
		exp >>= 1
		if exp == 0 {
			return result, nil
		}
		p, err := mulInt(sq, sq)
		if err != nil {
			return nil, err
		}
		sq = p.(int64)
	}
}

func (r *renderer) exec(nodes []node, sc *scope) error {
	for _, n := range nodes {
		if err := r.tick(); err != nil {
			return err
		}
		switch n := n.(type) {
		case *textNode:
			if err := r.emit(n.text); err != nil {
				return err
			}
		case *outputNode:
			v, err := r.eval(n.e, sc)
			if err != nil {
				return err
			}
			if err := r.emit(toStr(v)); err != nil {
				return err
			}
		case *ifNode:
			for i, c := range n.conds {
				v, err := r.eval(c, sc)
				if err != nil {
					return err
				}
				if truthy(v) {
					return0 := r.exec(n.bodies[i], sc)
					if return0 != nil {
						return return0
					}
					goto next
				}
			}
			if len(n.bodies) > len(n.conds) {
				if err := r.exec(n.bodies[len(n.conds)], sc); err != nil {
					return err
				}
			}
		case *forNode:
			if err := r.execFor(n, sc); err != nil {
				return err
			}
		case *setNode:
			if err := r.execSet(n, sc); err != nil {
				return err
			}
		case *macroNode:
			sc.vars[n.name] = &macro{node: n, scope: sc}
		case *breakNode:
			return errBreak
		case *continueNode:
			return errContinue
		}
	next:
	}
	return nil
}

func (r *renderer) execSet(n *setNode, sc *scope) error {
	var v value
	if n.body != nil {
		sub := &renderer{filters: r.filters, now: r.now, depth: r.depth, steps: r.steps, limit: r.limit}
		if err := sub.exec(n.body, sc); err != nil {
			return err
		}
		r.steps = sub.steps
		v = sub.out.String()
	} else {
		var err error
		if v, err = r.eval(n.value, sc); err != nil {
			return err
		}
	}
	if n.ns != "" {
		obj, _ := sc.lookup(n.ns)
		ns, ok := obj.(*namespace)
		if !ok {
			return fmt.Errorf("%w: cannot assign attribute on non-namespace object %s", ErrRender, n.ns)
		}
		ns.attrs.set(n.attr, v)
		return nil
	}
	if len(n.targets) == 1 {
		sc.vars[n.targets[0]] = v
		return nil
	}
	items, err := unpack(v, len(n.targets))
	if err != nil {
		return err
	}
	for i, t := range n.targets {
		sc.vars[t] = items[i]
	}
	return nil
}

func unpack(v value, n int) ([]value, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	if len(items) != n {
		return nil, fmt.Errorf("%w: cannot unpack %d values into %d names", ErrRender, len(items), n)
	}
	return items, nil
}

func (r *renderer) execFor(n *forNode, sc *scope) error {
	it, err := r.eval(n.iter, sc)
	if err != nil {
		return err
	}
	items, err := iterate(it)
	if err != nil {
		return err
	}
	bind := func(s *scope, item value) error {
		if len(n.targets) == 1 {
			s.vars[n.targets[0]] = item
			return nil
		}
		parts, err := unpack(item, len(n.targets))
		if err != nil {
			return err
		}
		for i, t := range n.targets {
			s.vars[t] = parts[i]
		}
		return nil
	}
	if n.filter != nil {
		var kept []value
		for _, item := range items {
			s := &scope{vars: map[string]value{}, parent: sc}
			if err := bind(s, item); err != nil {
				return err
			}
			v, err := r.eval(n.filter, s)
			if err != nil {
				return err
			}
			if truthy(v) {
				kept = append(kept, item)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		return r.exec(n.orElse, sc)
	}
	r.depth++
	defer func() { r.depth-- }()
	if r.depth > maxDepth {
		return fmt.Errorf("%w: loops nested too deep", ErrRender)
	}
	for i, item := range items {
		s := &scope{vars: map[string]value{}, parent: sc}
		if err := bind(s, item); err != nil {
			return err
		}
		li := &loopInfo{index0: i, length: len(items)}
		if i > 0 {
			li.prev, li.hasPrev = items[i-1], true
		}
		if i+1 < len(items) {
			li.next, li.hasNext = items[i+1], true
		}
		s.vars["loop"] = li
		err := r.exec(n.body, s)
		if err == errBreak {
			break
		}
		if err != nil && err != errContinue {
			return err
		}
	}
	return nil
}

// iterate lists what a for loop over v visits: a list's items, a dict's
// keys, a string's characters; nothing for undefined.
func iterate(v value) ([]value, error) {
	switch v := v.(type) {
	case *list:
		return v.items, nil
	case *dict:
		out := make([]value, len(v.keys))
		for i, k := range v.keys {
			out[i] = k
		}
		return out, nil
	case string:
		out := make([]value, 0, len(v))
		for _, c := range v {
			out = append(out, string(c))
		}
		return out, nil
	case *undefined:
		return nil, nil
	}
	return nil, fmt.Errorf("%w: '%s' object is not iterable", ErrRender, typeName(v))
}

// eval evaluates an expression, refusing a string result longer than
// maxOutput whichever operation built it.
func (r *renderer) eval(e expr, sc *scope) (value, error) {
	v, err := r.evalExpr(e, sc)
	if s, ok := v.(string); ok && err == nil {
		if err := checkLen(len(s)); err != nil {
			return nil, err
		}
	}
	return v, err
}

func (r *renderer) evalExpr(e expr, sc *scope) (value, error) {
	if err := r.tick(); err != nil {
		return nil, err
	}
	switch e := e.(type) {
	case *literal:
		return e.v, nil
	case *nameRef:
		if v, ok := sc.lookup(e.name); ok {
			return v, nil
		}
		if g, ok := r.global(e.name); ok {
			return g, nil
		}
		return &undefined{name: e.name}, nil
	case *listExpr:
		l := &list{tuple: e.tuple, items: make([]value, len(e.items))}
		for i, it := range e.items {
			v, err := r.eval(it, sc)
			if err != nil {
				return nil, err
			}
			l.items[i] = v
		}
		return l, nil
	case *dictExpr:
		d := newDict()
		for i := range e.keys {
			k, err := r.eval(e.keys[i], sc)
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("%w: dict keys other than strings", ErrUnsupported)
			}
			v, err := r.eval(e.vals[i], sc)
			if err != nil {
				return nil, err
			}
			d.set(ks, v)
		}
		return d, nil
	case *attrExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		return getAttr(obj, e.name)
	case *itemExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		key, err := r.eval(e.key, sc)
		if err != nil {
			return nil, err
		}
		return getItem(obj, key)
	case *sliceExpr:
		return r.evalSlice(e, sc)
	case *callExpr:
		fn, err := r.eval(e.fn, sc)
		if err != nil {
			return nil, err
		}
		args, kwargs, err := r.evalArgs(e.args, e.kwargs, sc)
		if err != nil {
			return nil, err
		}
		return r.call(fn, args, kwargs)
	case *filterExpr:
		arg, err := r.eval(e.arg, sc)
		if err != nil {
			return nil, err
		}
		args, kwargs, err := r.evalArgs(e.args, e.kwargs, sc)
		if err != nil {
			return nil, err
		}
		return r.filters[e.name](r, arg, args, kwargs)
	case *testExpr:
		arg, err := r.eval(e.arg, sc)
		if err != nil {
			return nil, err
		}
		args, _, err := r.evalArgs(e.args, nil, sc)
		if err != nil {
			return nil, err
		}
		ok, err := tests[e.name](arg, args)
		if err != nil {
			return nil, err
		}
		return ok != e.negate, nil
	case *unaryExpr:
		x, err := r.eval(e.x, sc)
		if err != nil {
			return nil, err
		}
		switch e.op {
		case "not":
			return !truthy(x), nil
		case "-":
			switch x := x.(type) {
			case int64:
				if x == math.MinInt64 {
					return nil, errIntOverflow
				}
				return -x, nil
			case float64:
				return -x, nil
			case bigInt:
				return x.negate(), nil
			case bool:
				return -b2i(x), nil
			}
		case "+":
			switch x := x.(type) {
			case int64, float64, bigInt:
				return x, nil
			case bool:
				return b2i(x), nil
			}
		}
		return nil, fmt.Errorf("%w: bad operand type for unary %s: '%s'", ErrRender, e.op, typeName(x))
	case *condExpr:
		c, err := r.eval(e.cond, sc)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return r.eval(e.yes, sc)
		}
		if e.no == nil {
			return &undefined{name: "conditional expression"}, nil
		}
		return r.eval(e.no, sc)
	case *binExpr:
		l, err := r.eval(e.l, sc)
		if err != nil {
			return nil, err
		}
		switch e.op {
		case "and":
			if !truthy(l) {
				return l, nil
			}
			return r.eval(e.r, sc)
		case "or":
			if truthy(l) {
				return l, nil
			}
			return r.eval(e.r, sc)
		}
		rv, err := r.eval(e.r, sc)
		if err != nil {
			return nil, err
		}
		return binary(e.op, l, rv)
	case *compareExpr:
		l, err := r.eval(e.first, sc)
		if err != nil {
			return nil, err
		}
		var res value
		for i, op := range e.ops {
			rv, err := r.eval(e.rest[i], sc)
			if err != nil {
				return nil, err
			}
			if res, err = binary(op, l, rv); err != nil {
				return nil, err
			}
			if !truthy(res) {
				return res, nil
			}
			l = rv
		}
		return res, nil
	}
	return nil, fmt.Errorf("%w: unknown expression %T", ErrRender, e)
}

func (r *renderer) evalArgs(args []expr, kwargs []kwarg, sc *scope) ([]value, *dict, error) {
	var av []value
	for _, a := range args {
		v, err := r.eval(a, sc)
		if err != nil {
			return nil, nil, err
		}
		av = append(av, v)
	}
	var kw *dict
	if len(kwargs) > 0 {
		kw = newDict()
		for _, k := range kwargs {
			v, err := r.eval(k.v, sc)
			if err != nil {
				return nil, nil, err
			}
			kw.set(k.name, v)
		}
	}
	return av, kw, nil
}

func (r *renderer) call(fn value, args []value, kwargs *dict) (value, error) {
	switch f := fn.(type) {
	case *callable:
		return f.fn(r, args, kwargs)
	case *macro:
		return r.callMacro(f, args, kwargs)
	case *undefined:
		return nil, fmt.Errorf("%w: '%s' is undefined", ErrRender, f.name)
	}
	return nil, fmt.Errorf("%w: '%s' object is not callable", ErrRender, typeName(fn))
}

func (r *renderer) callMacro(m *macro, args []value, kwargs *dict) (value, error) {
	n := m.node
	if len(args) > len(n.params) {
		return nil, fmt.Errorf("%w: macro '%s' takes not more than %d argument(s)", ErrRender, n.name, len(n.params))
	}
	s := &scope{vars: map[string]value{}, parent: m.scope}
	for i, p := range n.params {
		switch {
		case i < len(args):
			s.vars[p] = args[i]
		case kwargs != nil && kwargs.m[p] != nil || kwargs != nil && hasKey(kwargs, p):
			s.vars[p] = kwargs.m[p]
		case n.defaults[i] != nil:
			v, err := r.eval(n.defaults[i], s)
			if err != nil {
				return nil, err
			}
			s.vars[p] = v
		default:
			s.vars[p] = &undefined{name: p}
		}
	}
	if kwargs != nil {
		for _, k := range kwargs.keys {
			if !contains(n.params, k) {
				return nil, fmt.Errorf("%w: macro '%s' takes no keyword argument '%s'", ErrRender, n.name, k)
			}
		}
	}
	r.depth++
	defer func() { r.depth-- }()
	if r.depth > maxDepth {
		return nil, fmt.Errorf("%w: macro calls nested too deep", ErrRender)
	}
	sub := &renderer{filters: r.filters, now: r.now, depth: r.depth, steps: r.steps, limit: r.limit}
	err := sub.exec(n.body, s)
	r.steps = sub.steps
	if err == errBreak || err == errContinue {
		return nil, fmt.Errorf("%w: break or continue outside a loop", ErrRender)
	}
	if err != nil {
		return nil, err
	}
	return sub.out.String(), nil
}

func hasKey(d *dict, k string) bool { _, ok := d.m[k]; return ok }

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func (r *renderer) evalSlice(e *sliceExpr, sc *scope) (value, error) {
	obj, err := r.eval(e.obj, sc)
	if err != nil {
		return nil, err
	}
	var bounds [3]*int64
	for i, x := range []expr{e.start, e.stop, e.step} {
		if x == nil {
			continue
		}
		v, err := r.eval(x, sc)
		if err != nil {
			return nil, err
		}
		switch v := v.(type) {
		case nil:
		case int64:
			bounds[i] = &v
		case bool:
			n := b2i(v)
			bounds[i] = &n
		default:
			return nil, fmt.Errorf("%w: slice indices must be integers or None", ErrRender)
		}
	}
	var n int
	var runes []rune
	switch o := obj.(type) {
	case *list:
		n = len(o.items)
	case string:
		runes = []rune(o)
		n = len(runes)
	case *undefined:
		return nil, fmt.Errorf("%w: '%s' is undefined", ErrRender, o.name)
	default:
		return nil, fmt.Errorf("%w: '%s' object is not subscriptable", ErrRender, typeName(obj))
	}
	idx, err := sliceIndices(n, bounds)
	if err != nil {
		return nil, err
	}
	if l, ok := obj.(*list); ok {
		out := &list{tuple: l.tuple, items: make([]value, 0, len(idx))}
		for _, i := range idx {
			out.items = append(out.items, l.items[i])
		}
		return out, nil
	}
	var b strings.Builder
	for _, i := range idx {
		b.WriteRune(runes[i])
	}
	return b.String(), nil
}

// sliceIndices returns the indices s[start:stop:step] visits, as Python.
func sliceIndices(n int, b [3]*int64) ([]int, error) {
	step := int64(1)
	if b[2] != nil {
		step = *b[2]
	}
	if step == 0 {
		return nil, fmt.Errorf("%w: slice step cannot be zero", ErrRender)
	}
	ln := int64(n)
	clamp := func(p *int64, def int64) int64 {
		if p == nil {
			return def
		}
		v := *p
		if v < 0 {
			v += ln
			if v < 0 {
				if step < 0 {
					return -1
				}
				return 0
			}
		}
		if v >= ln {
			if step < 0 {
				return ln - 1
			}
			return ln
		}
		return v
	}
	var start, stop int64
	if step > 0 {
		start, stop = clamp(b[0], 0), clamp(b[1], ln)
	} else {
		start, stop = clamp(b[0], ln-1), clamp(b[1], -1)
		if b[1] != nil && *b[1] < -ln {
			stop = -1
		}
	}
	// The count as Python's slice length computes it; start + k*step
	// stays a valid index for every k below it, so nothing overflows.
	var count int64
	switch {
	case step > 0 && start < stop:
		count = (stop-start-1)/step + 1
	case step < 0 && stop < start:
		count = (start-stop-1)/(-step) + 1
	}
	out := make([]int, count)
	for k := range out {
		out[k] = int(start + int64(k)*step)
	}
	return out, nil
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// number reads ints, floats and bools (Python's bool is an int).
func number(v value) (int64, float64, bool, bool) {
	switch v := v.(type) {
	case int64:
		return v, float64(v), true, true
	case bool:
		return b2i(v), float64(b2i(v)), true, true
	case float64:
		return 0, v, false, true
	}
	return 0, 0, false, false
}

func binary(op string, l, r value) (value, error) {
	switch op {
	case "==":
		return equal(l, r), nil
	case "!=":
		return !equal(l, r), nil
	case "<", "<=", ">", ">=":
		c, err := compare(l, r)
		if err != nil {
			return nil, fmt.Errorf("%w: '%s' not supported between instances of '%s' and '%s'", ErrRender, op, typeName(l), typeName(r))
		}
		switch op {
		case "<":
			return c < 0, nil
		case "<=":
			return c <= 0, nil
		case ">":
			return c > 0, nil
		}
		return c >= 0, nil
	case "in", "not in":
		ok, err := containsValue(r, l)
		if err != nil {
			return nil, err
		}
		return ok == (op == "in"), nil
	case "~":
		return concat(toStr(l), toStr(r))
	}
	if u, ok := l.(*undefined); ok {
		return nil, fmt.Errorf("%w: '%s' is undefined", ErrRender, u.name)
	}
	if u, ok := r.(*undefined); ok {
		return nil, fmt.Errorf("%w: '%s' is undefined", ErrRender, u.name)
	}
	if err := refuseBigInt(op, l, r); err != nil {
		return nil, err
	}
	li, lf, lInt, lNum := number(l)
	ri, rf, rInt, rNum := number(r)
	if lNum && rNum {
		bothInt := lInt && rInt
		switch op {
		case "+":
			if bothInt {
				return addInt(li, ri)
			}
			return lf + rf, nil
		case "-":
			if bothInt {
				if ri == math.MinInt64 {
					return nil, errIntOverflow
				}
				return addInt(li, -ri)
			}
			return lf - rf, nil
		case "*":
			if bothInt {
				return mulInt(li, ri)
			}
			return lf * rf, nil
		case "/":
			if rf == 0 {
				return nil, fmt.Errorf("%w: division by zero", ErrRender)
			}
			return lf / rf, nil
		case "//":
			if rf == 0 {
				return nil, fmt.Errorf("%w: integer division or modulo by zero", ErrRender)
			}
			if bothInt {
				q := li / ri
				if (li%ri != 0) && ((li < 0) != (ri < 0)) {
					q--
				}
				return q, nil
			}
			return math.Floor(lf / rf), nil
		case "%":
			if rf == 0 {
				return nil, fmt.Errorf("%w: integer division or modulo by zero", ErrRender)
			}
			if bothInt {
				m := li % ri
				if m != 0 && (m < 0) != (ri < 0) {
					m += ri
				}
				return m, nil
			}
			m := math.Mod(lf, rf)
			if m != 0 && (m < 0) != (rf < 0) {
				m += rf
			}
			return m, nil
		case "**":
			if bothInt && ri >= 0 {
				return powInt(li, ri)
			}
			return math.Pow(lf, rf), nil
		}
	}
	switch op {
	case "+":
		switch lv := l.(type) {
		case string:
			if rs, ok := r.(string); ok {
				return concat(lv, rs)
			}
		case *list:
			if rl, ok := r.(*list); ok && rl.tuple == lv.tuple {
				if len(lv.items)+len(rl.items) > maxItems {
					return nil, fmt.Errorf("%w: list longer than %d items", ErrRender, maxItems)
				}
				return &list{tuple: lv.tuple, items: append(append([]value(nil), lv.items...), rl.items...)}, nil
			}
		}
	case "*":
		if _, _, isInt, ok := number(l); ok && isInt {
			l, r = r, l
		}
		if n, _, isInt, ok := number(r); ok && isInt {
			switch lv := l.(type) {
			case string:
				if n <= 0 || lv == "" {
					return "", nil
				}
				if n > maxOutput/int64(len(lv)) {
					return nil, errTooLong
				}
				return strings.Repeat(lv, int(n)), nil
			case *list:
				out := &list{tuple: lv.tuple}
				if n <= 0 || len(lv.items) == 0 {
					return out, nil
				}
				if n > maxItems/int64(len(lv.items)) {
					return nil, fmt.Errorf("%w: list longer than %d items", ErrRender, maxItems)
				}
				out.items = make([]value, 0, int(n)*len(lv.items))
				for range n {
					out.items = append(out.items, lv.items...)
				}
				return out, nil
			}
		}
	case "%":
		if _, ok := l.(string); ok {
			return nil, fmt.Errorf("%w: printf-style string formatting", ErrUnsupported)
		}
	}
	return nil, fmt.Errorf("%w: unsupported operand type(s) for %s: '%s' and '%s'", ErrRender, op, typeName(l), typeName(r))
}

func equal(a, b value) bool {
	if _, ok := a.(bigInt); ok {
		return equalBig(a, b)
	}
	if _, ok := b.(bigInt); ok {
		return equalBig(a, b)
	}
	if ai, af, aInt, ok := number(a); ok {
		if bi, bf, bInt, ok := number(b); ok {
			if aInt && bInt {
				return ai == bi
			}
			return af == bf
		}
		return false
	}
	switch a := a.(type) {
	case nil:
		return b == nil
	case *undefined:
		return isUndefined(b)
	case string:
		s, ok := b.(string)
		return ok && a == s
	case *list:
		l, ok := b.(*list)
		if !ok || l.tuple != a.tuple || len(l.items) != len(a.items) {
			return false
		}
		for i := range a.items {
			if !equal(a.items[i], l.items[i]) {
				return false
			}
		}
		return true
	case *dict:
		d, ok := b.(*dict)
		if !ok || len(d.keys) != len(a.keys) {
			return false
		}
		for _, k := range a.keys {
			v, ok := d.m[k]
			if !ok || !equal(a.m[k], v) {
				return false
			}
		}
		return true
	}
	return a == b
}

// equalBig is a == b where one is a bigInt: numbers compare by value,
// exactly, as Python's do.
func equalBig(a, b value) bool {
	x, okA := bigNumber(a)
	y, okB := bigNumber(b)
	return okA && okB && x.Cmp(y) == 0
}

func compare(a, b value) (int, error) {
	_, aBig := a.(bigInt)
	_, bBig := b.(bigInt)
	if aBig || bBig {
		x, okA := bigNumber(a)
		y, okB := bigNumber(b)
		if okA && okB {
			return x.Cmp(y), nil
		}
	}
	if _, af, _, ok := number(a); ok {
		if _, bf, _, ok := number(b); ok {
			switch {
			case af < bf:
				return -1, nil
			case af > bf:
				return 1, nil
			}
			return 0, nil
		}
	}
	if as, ok := a.(string); ok {
		if bs, ok := b.(string); ok {
			return strings.Compare(as, bs), nil
		}
	}
	if al, ok := a.(*list); ok {
		if bl, ok := b.(*list); ok {
			for i := 0; i < len(al.items) && i < len(bl.items); i++ {
				if equal(al.items[i], bl.items[i]) {
					continue
				}
				return compare(al.items[i], bl.items[i])
			}
			return len(al.items) - len(bl.items), nil
		}
	}
	return 0, fmt.Errorf("%w: not comparable", ErrRender)
}

func containsValue(container, item value) (bool, error) {
	switch c := container.(type) {
	case string:
		s, ok := item.(string)
		if !ok {
			return false, fmt.Errorf("%w: 'in <string>' requires string as left operand, not %s", ErrRender, typeName(item))
		}
		return strings.Contains(c, s), nil
	case *list:
		for _, x := range c.items {
			if equal(x, item) {
				return true, nil
			}
		}
		return false, nil
	case *dict:
		s, ok := item.(string)
		return ok && hasKey(c, s), nil
	case *undefined:
		return false, nil
	}
	return false, fmt.Errorf("%w: argument of type '%s' is not iterable", ErrRender, typeName(container))
}
