// Package chattemplate renders Hugging Face chat templates: the subset of
// Jinja that chat templates use, evaluated with the semantics of Python's
// jinja2 in the environment transformers' apply_chat_template sets up.
//
// # Usage
//
// Parse a template once, then render it from any goroutine:
//
//	t, err := chattemplate.Parse(src) // refuses unsupported syntax
//	if err != nil {
//		return err
//	}
//	text, err := t.Render(map[string]any{
//		"messages":              json.RawMessage(`[{"role":"user","content":"hi"}]`),
//		"add_generation_prompt": true,
//		"bos_token":             "<s>",
//	}, chattemplate.Options{})
//
// # The environment
//
// As in transformers: trim_blocks and lstrip_blocks are set, the loop
// controls ({% break %}, {% continue %}) are on, {% generation %} renders
// its body, and the globals raise_exception, strftime_now, namespace,
// dict and range are defined. tojson is transformers' version
// (json.dumps with ensure_ascii=False, indent, separators, sort_keys).
// Lists and dicts cannot be modified (the immutable sandbox).
//
// # The subset
//
// Statements: if/elif/else, for (with tuple targets, an if filter, else
// and the loop variable), set (names, tuples, namespace attributes, block
// set), macro, break, continue. Expressions: literals, lists, tuples,
// dicts, attribute and item access, slices, calls with keyword arguments,
// the arithmetic, comparison, logic, membership (in, not in), concatenation
// (~) and conditional operators, filters and tests. Python methods of
// str (strip, split, startswith, replace, ...) and dict (items, keys,
// values, get). Values print as Python prints them (None, True, repr of
// lists). Undefined values behave as jinja2's default Undefined.
//
// Everything else (include, import, extends, blocks, call blocks, filter
// blocks, recursive loops, unknown filters or tests, str.format, %
// formatting) is refused with an error wrapping ErrUnsupported, at Parse
// when the syntax shows it, else at Render.
//
// # Numbers and limits
//
// Integers are 64 bits. An integer in JSON variables that does not fit
// keeps its digits, as Python's json does: it prints, compares and
// serializes exactly, and arithmetic on it is refused (ErrUnsupported).
// Arithmetic whose result leaves 64 bits fails with an error wrapping
// ErrRender where Python would go on with a big integer. A rendering is
// bounded: Options.MaxSteps, 64 MiB for the output and for every string
// it builds, 1 Mi items for every list it builds; going past a bound is
// an error wrapping ErrRender.
package chattemplate
