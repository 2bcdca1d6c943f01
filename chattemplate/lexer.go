package chattemplate

import (
	"fmt"
	"strings"
)

// The lexer splits a template into text and tags the way Jinja does with
// trim_blocks and lstrip_blocks set (the settings of transformers' chat
// templates): newlines are normalised to "\n", one trailing newline of
// the source is dropped, "-" strips white space beside a tag, a newline
// right after a block or comment tag is dropped, and the spaces and tabs
// that start the line of a block or comment tag are dropped.

type tagKind uint8

const (
	tagText  tagKind = iota
	tagVar           // {{ ... }}
	tagBlock         // {% ... %}
)

type chunk struct {
	kind tagKind
	text string // raw text, or the tag's inside
	line int
}

func lex(src string) ([]chunk, error) {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	var out []chunk
	lineStarting := true // the previous tag ended a line (or none yet)
	line := 1
	pos := 0
	for pos < len(src) {
		k := indexTagStart(src, pos)
		if k < 0 {
			out = appendText(out, src[pos:], line)
			break
		}
		text := src[pos:k]
		open := src[k : k+2]
		j := k + 2
		stripBefore, keepBefore := false, false
		if j < len(src) && src[j] == '-' {
			stripBefore = true
			j++
		} else if j < len(src) && src[j] == '+' {
			keepBefore = true
			j++
		}
		switch {
		case stripBefore:
			text = strings.TrimRight(text, " \t\n\v\f\r")
		case open != "{{" && !keepBefore:
			// lstrip_blocks
			l := strings.LastIndexByte(text, '\n') + 1
			if (l > 0 || lineStarting) && strings.Trim(text[l:], " \t") == "" {
				text = text[:l]
			}
		}
		out = appendText(out, text, line)
		line += strings.Count(src[pos:k], "\n")
		var closeTok string
		switch open {
		case "{{":
			closeTok = "}}"
		case "{%":
			closeTok = "%}"
		default:
			closeTok = "#}"
		}
		end, inner, err := findClose(src, j, closeTok, open == "{#")
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		stripAfter := strings.HasSuffix(inner, "-")
		keepAfter := strings.HasSuffix(inner, "+") && open != "{{"
		if stripAfter || keepAfter {
			inner = inner[:len(inner)-1]
		}
		after := end + 2
		line += strings.Count(src[k:after], "\n")
		switch open {
		case "{{":
			out = append(out, chunk{tagVar, inner, line})
		case "{%":
			out = append(out, chunk{tagBlock, inner, line})
		}
		lineStarting = false
		if stripAfter {
			n := len(src[after:]) - len(strings.TrimLeft(src[after:], " \t\n\v\f\r"))
			line += strings.Count(src[after:after+n], "\n")
			after += n
		} else if open != "{{" && !keepAfter && after < len(src) && src[after] == '\n' {
			// trim_blocks
			after++
			line++
			lineStarting = true
		}
		pos = after
	}
	return out, nil
}

func appendText(out []chunk, text string, line int) []chunk {
	if text == "" {
		return out
	}
	return append(out, chunk{tagText, text, line})
}

// indexTagStart finds the next "{{", "{%" or "{#" from pos.
func indexTagStart(s string, pos int) int {
	for i := pos; i+1 < len(s); i++ {
		if s[i] == '{' && (s[i+1] == '{' || s[i+1] == '%' || s[i+1] == '#') {
			return i
		}
	}
	return -1
}

// findClose finds the closing delimiter of a tag, skipping string
// literals inside expressions. It returns the index of the delimiter and
// the text between.
func findClose(s string, from int, closeTok string, comment bool) (int, string, error) {
	if comment {
		k := strings.Index(s[from:], closeTok)
		if k < 0 {
			return 0, "", fmt.Errorf("%w: unclosed comment", ErrSyntax)
		}
		return from + k, s[from : from+k], nil
	}
	var quote byte
	for i := from; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case strings.HasPrefix(s[i:], closeTok):
			return i, s[from:i], nil
		}
	}
	return 0, "", fmt.Errorf("%w: unclosed tag (want %q)", ErrSyntax, closeTok)
}
