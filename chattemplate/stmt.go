package chattemplate

import (
	"fmt"
	"strings"
)

// Statements.
type node interface{}

type (
	textNode   struct{ text string }
	outputNode struct{ e expr }
	ifNode     struct {
		conds  []expr
		bodies [][]node // len(bodies) == len(conds) or len(conds)+1 (else)
	}
	forNode struct {
		targets []string
		iter    expr
		filter  expr
		body    []node
		orElse  []node
	}
	setNode struct {
		targets []string // one name, or names to unpack
		ns      string   // set ns.attr = ...
		attr    string
		value   expr
		body    []node // block set
	}
	macroNode struct {
		name     string
		params   []string
		defaults []expr // aligned with params; nil when required
		body     []node
	}
	breakNode    struct{}
	continueNode struct{}
)

type stmtParser struct {
	chunks []chunk
	pos    int
	depth  int // nesting of statements
}

// parseBody parses nodes until one of the end tags, returning the tag met
// (its first word) and its remaining tokens.
func (p *stmtParser) parseBody(ends ...string) ([]node, string, *exprParser, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxNesting {
		return nil, "", nil, fmt.Errorf("%w: statements nested too deep", ErrSyntax)
	}
	var out []node
	for p.pos < len(p.chunks) {
		c := p.chunks[p.pos]
		p.pos++
		switch c.kind {
		case tagText:
			out = append(out, &textNode{c.text})
		case tagVar:
			e, err := parseExpression(c.text)
			if err != nil {
				return nil, "", nil, fmt.Errorf("line %d: %w", c.line, err)
			}
			out = append(out, &outputNode{e})
		case tagBlock:
			toks, err := tokenize(c.text)
			if err != nil {
				return nil, "", nil, fmt.Errorf("line %d: %w", c.line, err)
			}
			ep := &exprParser{toks: toks}
			word, err := ep.name()
			if err != nil {
				return nil, "", nil, fmt.Errorf("line %d: %w", c.line, err)
			}
			for _, e := range ends {
				if word == e {
					return out, word, ep, nil
				}
			}
			n, err := p.parseStatement(word, ep)
			if err != nil {
				return nil, "", nil, fmt.Errorf("line %d: %w", c.line, err)
			}
			if n != nil {
				out = append(out, n)
			}
		}
	}
	if len(ends) > 0 {
		return nil, "", nil, fmt.Errorf("%w: missing {%% %s %%}", ErrSyntax, ends[len(ends)-1])
	}
	return out, "", nil, nil
}

func endOf(ep *exprParser) error {
	if ep.peek().kind != tkEOF {
		return fmt.Errorf("%w: unexpected %s", ErrSyntax, ep.describe())
	}
	return nil
}

func (p *stmtParser) parseStatement(word string, ep *exprParser) (node, error) {
	switch word {
	case "if":
		n := &ifNode{}
		cond, err := ep.parseTuple()
		if err == nil {
			err = endOf(ep)
		}
		if err != nil {
			return nil, err
		}
		for {
			body, end, ep2, err := p.parseBody("elif", "else", "endif")
			if err != nil {
				return nil, err
			}
			n.conds, n.bodies = append(n.conds, cond), append(n.bodies, body)
			switch end {
			case "elif":
				if cond, err = ep2.parseTuple(); err == nil {
					err = endOf(ep2)
				}
				if err != nil {
					return nil, err
				}
				continue
			case "else":
				if err := endOf(ep2); err != nil {
					return nil, err
				}
				body, _, ep3, err := p.parseBody("endif")
				if err != nil {
					return nil, err
				}
				n.bodies = append(n.bodies, body)
				return n, endOf(ep3)
			}
			return n, endOf(ep2)
		}
	case "for":
		n := &forNode{}
		for {
			name, err := ep.name()
			if err != nil {
				return nil, err
			}
			n.targets = append(n.targets, name)
			if !ep.isOp(",") {
				break
			}
			ep.next()
		}
		if !ep.isName("in") {
			return nil, fmt.Errorf("%w: expected 'in' in for", ErrSyntax)
		}
		ep.next()
		var err error
		if n.iter, err = ep.parseOr(); err != nil {
			return nil, err
		}
		if ep.isName("if") {
			ep.next()
			if n.filter, err = ep.parseExpr(); err != nil {
				return nil, err
			}
		}
		if ep.isName("recursive") {
			return nil, fmt.Errorf("%w: recursive loops", ErrUnsupported)
		}
		if err := endOf(ep); err != nil {
			return nil, err
		}
		body, end, ep2, err := p.parseBody("else", "endfor")
		if err != nil {
			return nil, err
		}
		n.body = body
		if err := endOf(ep2); err != nil {
			return nil, err
		}
		if end == "else" {
			body, _, ep3, err := p.parseBody("endfor")
			if err != nil {
				return nil, err
			}
			n.orElse = body
			return n, endOf(ep3)
		}
		return n, nil
	case "set":
		n := &setNode{}
		name, err := ep.name()
		if err != nil {
			return nil, err
		}
		if ep.isOp(".") {
			ep.next()
			attr, err := ep.name()
			if err != nil {
				return nil, err
			}
			n.ns, n.attr = name, attr
		} else {
			n.targets = []string{name}
			for ep.isOp(",") {
				ep.next()
				more, err := ep.name()
				if err != nil {
					return nil, err
				}
				n.targets = append(n.targets, more)
			}
		}
		if ep.peek().kind == tkEOF && n.ns == "" && len(n.targets) == 1 {
			body, _, ep2, err := p.parseBody("endset")
			if err != nil {
				return nil, err
			}
			n.body = body
			return n, endOf(ep2)
		}
		if ep.isOp("|") {
			return nil, fmt.Errorf("%w: filtered block set", ErrUnsupported)
		}
		if err := ep.expectOp("="); err != nil {
			return nil, err
		}
		if n.value, err = ep.parseTuple(); err != nil {
			return nil, err
		}
		return n, endOf(ep)
	case "macro":
		n := &macroNode{}
		var err error
		if n.name, err = ep.name(); err != nil {
			return nil, err
		}
		if err := ep.expectOp("("); err != nil {
			return nil, err
		}
		for !ep.isOp(")") {
			param, err := ep.name()
			if err != nil {
				return nil, err
			}
			var def expr
			if ep.isOp("=") {
				ep.next()
				if def, err = ep.parseExpr(); err != nil {
					return nil, err
				}
			}
			n.params, n.defaults = append(n.params, param), append(n.defaults, def)
			if !ep.isOp(",") {
				break
			}
			ep.next()
		}
		if err := ep.expectOp(")"); err != nil {
			return nil, err
		}
		if err := endOf(ep); err != nil {
			return nil, err
		}
		body, _, ep2, err := p.parseBody("endmacro")
		if err != nil {
			return nil, err
		}
		n.body = body
		return n, endOf(ep2)
	case "break":
		return &breakNode{}, endOf(ep)
	case "continue":
		return &continueNode{}, endOf(ep)
	case "generation":
		// transformers' assistant-mask marker: renders its body.
		if err := endOf(ep); err != nil {
			return nil, err
		}
		body, _, ep2, err := p.parseBody("endgeneration")
		if err != nil {
			return nil, err
		}
		return &ifNode{conds: []expr{&literal{true}}, bodies: [][]node{body}}, endOf(ep2)
	case "elif", "else", "endif", "endfor", "endset", "endmacro", "endgeneration":
		return nil, fmt.Errorf("%w: unexpected {%% %s %%}", ErrSyntax, word)
	}
	return nil, fmt.Errorf("%w: tag {%% %s %%}", ErrUnsupported, strings.TrimSpace(word))
}
