package chattemplate

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Errors. Parse errors wrap ErrSyntax or ErrUnsupported; Render errors
// wrap ErrRender, ErrInput or ErrUnsupported, or are a *RaisedError.
var (
	// ErrSyntax is wrapped by errors about a malformed template.
	ErrSyntax = errors.New("chattemplate: syntax error")
	// ErrUnsupported is wrapped by errors about Jinja features this
	// package does not implement (found at Parse where the syntax shows
	// them, such as an unknown filter, tag or test).
	ErrUnsupported = errors.New("chattemplate: unsupported")
	// ErrRender is wrapped by errors raised while rendering, as Jinja
	// would raise them (an undefined value used, a type error, ...).
	ErrRender = errors.New("chattemplate: render error")
	// ErrInput is wrapped by errors about variables given to Render.
	ErrInput = errors.New("chattemplate: bad input")
)

// RaisedError is the error of the template's own raise_exception(message)
// call, such as "Conversation roles must alternate user/assistant/...".
type RaisedError struct{ Message string }

func (e *RaisedError) Error() string { return "chattemplate: template raised: " + e.Message }

// Template is a parsed chat template. It is immutable and safe for
// concurrent use.
type Template struct {
	body []node
}

// Parse parses a Jinja chat template with the settings transformers uses
// (trim_blocks, lstrip_blocks, the loop controls extension). Features
// outside the supported subset are refused with an error wrapping
// ErrUnsupported rather than rendered differently.
func Parse(src string) (*Template, error) {
	chunks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &stmtParser{chunks: chunks}
	body, _, _, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	if err := checkLoops(body, false); err != nil {
		return nil, err
	}
	return &Template{body: body}, nil
}

// checkLoops refuses break and continue outside loops.
func checkLoops(nodes []node, inLoop bool) error {
	for _, n := range nodes {
		switch n := n.(type) {
		case *breakNode, *continueNode:
			if !inLoop {
				return fmt.Errorf("%w: break or continue outside a loop", ErrSyntax)
			}
		case *ifNode:
			for _, b := range n.bodies {
				if err := checkLoops(b, inLoop); err != nil {
					return err
				}
			}
		case *forNode:
			if err := checkLoops(n.body, true); err != nil {
				return err
			}
			if err := checkLoops(n.orElse, inLoop); err != nil {
				return err
			}
		case *setNode:
			if err := checkLoops(n.body, false); err != nil {
				return err
			}
		case *macroNode:
			if err := checkLoops(n.body, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// Options tune a rendering. The zero value is ready to use.
type Options struct {
	// Now is the clock of strftime_now. Nil means time.Now.
	Now func() time.Time
	// MaxSteps bounds the work of one rendering (expressions evaluated
	// and statements run), so that a hostile template cannot loop for
	// long. Zero means 10 million.
	MaxSteps int
}

// Render renders the template with the given variables, such as
// "messages", "tools", "add_generation_prompt", "bos_token" and any
// chat_template_kwargs. Values may be nil, bool, integers, float64,
// string, json.Number, []any, []string, map[string]any (read in sorted key
// order) or json.RawMessage (decoded keeping the key order of objects,
// which tojson preserves as Python does, and the digits of integers beyond
// 64 bits).
//
// A failure of the engine itself (a panic) is returned as an error
// wrapping ErrRender rather than taking the process down.
func (t *Template) Render(vars map[string]any, opts Options) (out string, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = "", fmt.Errorf("%w: internal error: %v", ErrRender, p)
		}
	}()
	root := &scope{vars: make(map[string]value, len(vars))}
	for k, v := range vars {
		x, err := fromGo(v, 0)
		if err != nil {
			return "", fmt.Errorf("variable %q: %w", k, err)
		}
		root.vars[k] = x
	}
	r := &renderer{filters: filters, now: opts.Now, limit: opts.MaxSteps}
	if r.now == nil {
		r.now = time.Now
	}
	if r.limit <= 0 {
		r.limit = 10_000_000
	}
	if err := r.exec(t.body, root); err != nil {
		return "", err
	}
	return r.out.String(), nil
}

// strftime formats t with Python's strftime directives.
func strftime(t time.Time, f string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 >= len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'Y':
			fmt.Fprintf(&b, "%d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'b':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			fmt.Fprintf(&b, "%02d", (t.Hour()+11)%12+1)
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case '%':
			b.WriteByte('%')
		default:
			return "", fmt.Errorf("%w: strftime directive %%%c", ErrUnsupported, f[i])
		}
	}
	return b.String(), nil
}
