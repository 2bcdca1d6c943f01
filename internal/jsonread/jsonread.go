// Package jsonread decodes JSON with jsontext under encoding/json's
// rules, the ones kvroute's request, chat and template readers keep so
// that they accept exactly what encoding/json accepts.
package jsonread

import (
	"bytes"

	"github.com/go-json-experiment/json/jsontext"
)

// NewDecoder returns a decoder of data that allows duplicate object names
// (callers keep the last, as encoding/json does) and replaces invalid
// UTF-8 in strings with U+FFFD.
func NewDecoder(data []byte) *jsontext.Decoder {
	return jsontext.NewDecoder(bytes.NewBuffer(data), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
}
