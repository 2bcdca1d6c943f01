package chattemplate

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Expression tokens.
type tokKind uint8

const (
	tkEOF tokKind = iota
	tkName
	tkString
	tkInt
	tkFloat
	tkOp
)

type token struct {
	kind tokKind
	s    string // name, operator, or the decoded string literal
	i    int64
	f    float64
}

var operators = []string{"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"}

func tokenize(src string) ([]token, error) {
	var out []token
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i + 1
			for j < len(src) && (src[j] == '_' || src[j] >= 'a' && src[j] <= 'z' || src[j] >= 'A' && src[j] <= 'Z' || src[j] >= '0' && src[j] <= '9') {
				j++
			}
			out = append(out, token{kind: tkName, s: src[i:j]})
			i = j
		case c >= '0' && c <= '9':
			j := i
			isFloat := false
			for j < len(src) && (src[j] >= '0' && src[j] <= '9' || src[j] == '_') {
				j++
			}
			if j+1 < len(src) && src[j] == '.' && src[j+1] >= '0' && src[j+1] <= '9' {
				isFloat = true
				j++
				for j < len(src) && (src[j] >= '0' && src[j] <= '9' || src[j] == '_') {
					j++
				}
			}
			if j < len(src) && (src[j] == 'e' || src[j] == 'E') {
				k := j + 1
				if k < len(src) && (src[k] == '+' || src[k] == '-') {
					k++
				}
				if k < len(src) && src[k] >= '0' && src[k] <= '9' {
					isFloat = true
					j = k
					for j < len(src) && src[j] >= '0' && src[j] <= '9' {
						j++
					}
				}
			}
			lit := strings.ReplaceAll(src[i:j], "_", "")
			if isFloat {
				f, err := strconv.ParseFloat(lit, 64)
				if err != nil {
					return nil, fmt.Errorf("%w: number %q", ErrSyntax, src[i:j])
				}
				out = append(out, token{kind: tkFloat, f: f})
			} else {
				n, err := strconv.ParseInt(lit, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("%w: number %q", ErrSyntax, src[i:j])
				}
				out = append(out, token{kind: tkInt, i: n})
			}
			i = j
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(src) && src[j] != c {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(src) {
				return nil, fmt.Errorf("%w: unterminated string", ErrSyntax)
			}
			s, err := unescape(src[i+1 : j])
			if err != nil {
				return nil, err
			}
			out = append(out, token{kind: tkString, s: s})
			i = j + 1
		default:
			found := false
			for _, op := range operators {
				if strings.HasPrefix(src[i:], op) {
					out = append(out, token{kind: tkOp, s: op})
					i += len(op)
					found = true
					break
				}
			}
			if !found {
				return nil, fmt.Errorf("%w: unexpected character %q", ErrSyntax, c)
			}
		}
	}
	return append(out, token{kind: tkEOF}), nil
}

// unescape decodes a string literal's backslash escapes as Python's
// unicode-escape codec does (Jinja's rule); unknown escapes stay as they are.
func unescape(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch e := s[i]; e {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case '\\', '\'', '"':
			b.WriteByte(e)
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		case '\n':
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+1+n > len(s) {
				return "", fmt.Errorf("%w: truncated \\%c escape", ErrSyntax, e)
			}
			v, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32)
			if err != nil || !utf8.ValidRune(rune(v)) {
				return "", fmt.Errorf("%w: bad \\%c escape", ErrSyntax, e)
			}
			b.WriteRune(rune(v))
			i += n
		case '0', '1', '2', '3', '4', '5', '6', '7':
			j := i
			for j < len(s) && j < i+3 && s[j] >= '0' && s[j] <= '7' {
				j++
			}
			v, _ := strconv.ParseUint(s[i:j], 8, 32)
			b.WriteRune(rune(v))
			i = j - 1
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return b.String(), nil
}

// Expressions.
type expr interface{}

type (
	literal  struct{ v value }
	nameRef  struct{ name string }
	listExpr struct {
		items []expr
		tuple bool
	}
	dictExpr struct{ keys, vals []expr }
	attrExpr struct {
		obj  expr
		name string
	}
	itemExpr  struct{ obj, key expr }
	sliceExpr struct{ obj, start, stop, step expr }
	callExpr  struct {
		fn     expr
		args   []expr
		kwargs []kwarg
	}
	filterExpr struct {
		arg    expr
		name   string
		args   []expr
		kwargs []kwarg
	}
	testExpr struct {
		arg    expr
		name   string
		args   []expr
		negate bool
	}
	binExpr struct {
		op   string
		l, r expr
	}
	// compareExpr is a chain of comparisons, x op1 y op2 z ..., which
	// holds when each holds, as in Python: x op1 y and y op2 z, each
	// operand evaluated once and the chain stopping at the first that
	// does not hold.
	compareExpr struct {
		first expr
		ops   []string
		rest  []expr
	}
	unaryExpr struct {
		op string
		x  expr
	}
	condExpr struct{ cond, yes, no expr } // no may be nil
)

type kwarg struct {
	name string
	v    expr
}

type exprParser struct {
	toks  []token
	pos   int
	depth int // nesting of parseExpr calls
}

// maxNesting bounds the nesting of expressions and of statements.
const maxNesting = 200

func (p *exprParser) peek() token { return p.toks[p.pos] }
func (p *exprParser) next() token {
	t := p.toks[p.pos]
	if t.kind != tkEOF {
		p.pos++
	}
	return t
}
func (p *exprParser) isOp(s string) bool {
	t := p.peek()
	return t.kind == tkOp && t.s == s
}
func (p *exprParser) isName(s string) bool {
	t := p.peek()
	return t.kind == tkName && t.s == s
}
func (p *exprParser) expectOp(s string) error {
	if !p.isOp(s) {
		return fmt.Errorf("%w: expected %q, found %s", ErrSyntax, s, p.describe())
	}
	p.next()
	return nil
}
func (p *exprParser) describe() string {
	t := p.peek()
	switch t.kind {
	case tkEOF:
		return "end of tag"
	case tkString:
		return strconv.Quote(t.s)
	case tkInt:
		return strconv.FormatInt(t.i, 10)
	case tkFloat:
		return strconv.FormatFloat(t.f, 'g', -1, 64)
	}
	return strconv.Quote(t.s)
}
func (p *exprParser) name() (string, error) {
	t := p.peek()
	if t.kind != tkName {
		return "", fmt.Errorf("%w: expected a name, found %s", ErrSyntax, p.describe())
	}
	p.next()
	return t.s, nil
}

// parseTuple parses an expression, or a tuple when commas follow
// (for-loop iterables, set values).
func (p *exprParser) parseTuple() (expr, error) {
	first, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	if !p.isOp(",") {
		return first, nil
	}
	items := []expr{first}
	for p.isOp(",") {
		p.next()
		if p.peek().kind == tkEOF || p.isName("if") || p.isOp(")") || p.isOp("=") {
			break
		}
		e, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	return &listExpr{items: items, tuple: true}, nil
}

func (p *exprParser) parseExpr() (expr, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxNesting {
		return nil, fmt.Errorf("%w: expression nested too deep", ErrSyntax)
	}
	e, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	if p.isName("if") {
		p.next()
		cond, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		c := &condExpr{cond: cond, yes: e}
		if p.isName("else") {
			p.next()
			if c.no, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		return c, nil
	}
	return e, nil
}

// binaryLevel parses operand (op operand)*, left-associative, for the
// operators ops (symbols or keywords), as each precedence level of
// Jinja's parser does.
func (p *exprParser) binaryLevel(operand func() (expr, error), ops ...string) (expr, error) {
	l, err := operand()
	for err == nil {
		t := p.peek()
		op := ""
		for _, o := range ops {
			if (t.kind == tkOp || t.kind == tkName) && t.s == o {
				op = o
				break
			}
		}
		if op == "" {
			break
		}
		p.next()
		var r expr
		if r, err = operand(); err == nil {
			l = &binExpr{op, l, r}
		}
	}
	return l, err
}

func (p *exprParser) parseOr() (expr, error) { return p.binaryLevel(p.parseAnd, "or") }

func (p *exprParser) parseAnd() (expr, error) { return p.binaryLevel(p.parseNot, "and") }

func (p *exprParser) parseNot() (expr, error) {
	if p.isName("not") {
		p.depth++
		defer func() { p.depth-- }()
		if p.depth > maxNesting {
			return nil, fmt.Errorf("%w: expression nested too deep", ErrSyntax)
		}
		p.next()
		x, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{"not", x}, nil
	}
	return p.parseCompare()
}

func (p *exprParser) parseCompare() (expr, error) {
	l, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	var chain *compareExpr
	for {
		var op string
		t := p.peek()
		switch {
		case t.kind == tkOp && (t.s == "==" || t.s == "!=" || t.s == "<" || t.s == "<=" || t.s == ">" || t.s == ">="):
			op = t.s
			p.next()
		case p.isName("in"):
			op = "in"
			p.next()
		case p.isName("not") && p.toks[p.pos+1].kind == tkName && p.toks[p.pos+1].s == "in":
			op = "not in"
			p.next()
			p.next()
		default:
			if chain != nil && len(chain.ops) == 1 {
				return &binExpr{chain.ops[0], chain.first, chain.rest[0]}, nil
			}
			if chain != nil {
				return chain, nil
			}
			return l, nil
		}
		r, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		if chain == nil {
			chain = &compareExpr{first: l}
		}
		chain.ops, chain.rest = append(chain.ops, op), append(chain.rest, r)
	}
}

func (p *exprParser) parseMath1() (expr, error) { return p.binaryLevel(p.parseConcat, "+", "-") }

func (p *exprParser) parseConcat() (expr, error) { return p.binaryLevel(p.parseMath2, "~") }

func (p *exprParser) parseMath2() (expr, error) {
	return p.binaryLevel(p.parsePow, "*", "/", "//", "%")
}

func (p *exprParser) parsePow() (expr, error) {
	return p.binaryLevel(func() (expr, error) { return p.parseUnary(true) }, "**")
}

func (p *exprParser) parseUnary(withFilter bool) (expr, error) {
	var e expr
	var err error
	switch {
	case p.isOp("-") || p.isOp("+"):
		p.depth++
		defer func() { p.depth-- }()
		if p.depth > maxNesting {
			return nil, fmt.Errorf("%w: expression nested too deep", ErrSyntax)
		}
		op := p.next().s
		x, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		e = &unaryExpr{op, x}
	default:
		if e, err = p.parsePrimary(); err != nil {
			return nil, err
		}
	}
	if e, err = p.parsePostfix(e); err != nil {
		return nil, err
	}
	if withFilter {
		return p.parseFilters(e)
	}
	return e, nil
}

func (p *exprParser) parsePrimary() (expr, error) {
	start := p.pos
	t := p.next()
	switch t.kind {
	case tkName:
		switch t.s {
		case "true", "True":
			return &literal{true}, nil
		case "false", "False":
			return &literal{false}, nil
		case "none", "None":
			return &literal{nil}, nil
		}
		return &nameRef{t.s}, nil
	case tkString:
		s := t.s
		for p.peek().kind == tkString { // adjacent literals concatenate
			s += p.next().s
		}
		return &literal{s}, nil
	case tkInt:
		return &literal{t.i}, nil
	case tkFloat:
		return &literal{t.f}, nil
	case tkOp:
		switch t.s {
		case "(":
			if p.isOp(")") {
				p.next()
				return &listExpr{tuple: true}, nil
			}
			e, err := p.parseTuple()
			if err != nil {
				return nil, err
			}
			return e, p.expectOp(")")
		case "[":
			l := &listExpr{}
			for !p.isOp("]") {
				e, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				l.items = append(l.items, e)
				if !p.isOp(",") {
					break
				}
				p.next()
			}
			return l, p.expectOp("]")
		case "{":
			d := &dictExpr{}
			for !p.isOp("}") {
				k, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				if err := p.expectOp(":"); err != nil {
					return nil, err
				}
				v, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				d.keys, d.vals = append(d.keys, k), append(d.vals, v)
				if !p.isOp(",") {
					break
				}
				p.next()
			}
			return d, p.expectOp("}")
		}
	}
	p.pos = start
	return nil, fmt.Errorf("%w: unexpected %s", ErrSyntax, p.describe())
}

func (p *exprParser) parsePostfix(e expr) (expr, error) {
	for {
		switch {
		case p.isOp("."):
			p.next()
			t := p.next()
			switch t.kind {
			case tkName:
				e = &attrExpr{e, t.s}
			case tkInt:
				e = &itemExpr{e, &literal{t.i}}
			default:
				return nil, fmt.Errorf("%w: expected an attribute name after '.'", ErrSyntax)
			}
		case p.isOp("["):
			p.next()
			var err error
			if e, err = p.parseSubscript(e); err != nil {
				return nil, err
			}
		case p.isOp("("):
			p.next()
			args, kwargs, err := p.parseArgs()
			if err != nil {
				return nil, err
			}
			e = &callExpr{e, args, kwargs}
		default:
			return e, nil
		}
	}
}

func (p *exprParser) parseSubscript(obj expr) (expr, error) {
	var parts [3]expr
	n := 0
	isSlice := false
	for {
		if !p.isOp(":") && !p.isOp("]") {
			e, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			parts[n] = e
		}
		if p.isOp(":") {
			p.next()
			isSlice = true
			n++
			if n > 2 {
				return nil, fmt.Errorf("%w: too many ':' in a subscript", ErrSyntax)
			}
			continue
		}
		break
	}
	if err := p.expectOp("]"); err != nil {
		return nil, err
	}
	if !isSlice {
		if parts[0] == nil {
			return nil, fmt.Errorf("%w: empty subscript", ErrSyntax)
		}
		return &itemExpr{obj, parts[0]}, nil
	}
	return &sliceExpr{obj, parts[0], parts[1], parts[2]}, nil
}

// parseArgs parses call arguments after "(" up to and including ")".
func (p *exprParser) parseArgs() ([]expr, []kwarg, error) {
	var args []expr
	var kwargs []kwarg
	for !p.isOp(")") {
		if p.isOp("*") || p.isOp("**") {
			return nil, nil, fmt.Errorf("%w: *args and **kwargs in calls", ErrUnsupported)
		}
		if p.peek().kind == tkName && p.toks[p.pos+1].kind == tkOp && p.toks[p.pos+1].s == "=" {
			name := p.next().s
			p.next()
			v, err := p.parseExpr()
			if err != nil {
				return nil, nil, err
			}
			kwargs = append(kwargs, kwarg{name, v})
		} else {
			if len(kwargs) > 0 {
				return nil, nil, fmt.Errorf("%w: positional argument after keyword argument", ErrSyntax)
			}
			v, err := p.parseExpr()
			if err != nil {
				return nil, nil, err
			}
			args = append(args, v)
		}
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	return args, kwargs, p.expectOp(")")
}

func (p *exprParser) parseFilters(e expr) (expr, error) {
	for {
		switch {
		case p.isOp("|"):
			p.next()
			name, err := p.dottedName()
			if err != nil {
				return nil, err
			}
			if _, ok := filters[name]; !ok {
				return nil, fmt.Errorf("%w: filter %q", ErrUnsupported, name)
			}
			f := &filterExpr{arg: e, name: name}
			if p.isOp("(") {
				p.next()
				if f.args, f.kwargs, err = p.parseArgs(); err != nil {
					return nil, err
				}
			}
			e = f
		case p.isName("is"):
			p.next()
			t := &testExpr{arg: e}
			if p.isName("not") {
				p.next()
				t.negate = true
			}
			name, err := p.dottedName()
			if err != nil {
				return nil, err
			}
			if _, ok := tests[name]; !ok {
				return nil, fmt.Errorf("%w: test %q", ErrUnsupported, name)
			}
			t.name = name
			switch tk := p.peek(); {
			case p.isOp("("):
				p.next()
				args, kwargs, err := p.parseArgs()
				if err != nil {
					return nil, err
				}
				if len(kwargs) > 0 {
					return nil, fmt.Errorf("%w: keyword arguments to a test", ErrUnsupported)
				}
				t.args = args
			case tk.kind == tkString || tk.kind == tkInt || tk.kind == tkFloat || p.isOp("[") || p.isOp("{") ||
				tk.kind == tkName && tk.s != "else" && tk.s != "or" && tk.s != "and" && tk.s != "if" && tk.s != "is" && tk.s != "in" && tk.s != "not":
				arg, err := p.parseUnary(false)
				if err != nil {
					return nil, err
				}
				t.args = []expr{arg}
			}
			e = t
		case p.isOp("("):
			var err error
			if e, err = p.parsePostfix(e); err != nil {
				return nil, err
			}
		default:
			return e, nil
		}
	}
}

func (p *exprParser) dottedName() (string, error) {
	name, err := p.name()
	for err == nil && p.isOp(".") {
		p.next()
		var more string
		more, err = p.name()
		name += "." + more
	}
	return name, err
}

func parseExpression(src string) (expr, error) {
	toks, err := tokenize(src)
	if err != nil {
		return nil, err
	}
	p := &exprParser{toks: toks}
	e, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	if p.peek().kind != tkEOF {
		return nil, fmt.Errorf("%w: unexpected %s after expression", ErrSyntax, p.describe())
	}
	return e, nil
}
