package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
)

// errConfig is wrapped by every error of the configuration file.
var errConfig = errors.New("invalid configuration")

// configError is an error in the configuration file. Field is the JSON
// path of the setting at fault, such as "engines[1].url" or
// "health_interval"; it is empty for JSON that does not parse, whose
// error is at byte Offset.
type configError struct {
	Field  string
	Offset int64
	Err    error
}

// Error implements error.
func (e *configError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%v: at byte %d: %v", errConfig, e.Offset, e.Err)
	}
	return fmt.Sprintf("%v: %s: %v", errConfig, e.Field, e.Err)
}

// Unwrap returns the cause.
func (e *configError) Unwrap() error { return e.Err }

// Is reports errConfig.
func (e *configError) Is(target error) bool { return target == errConfig }

// fileSettings is a decoded and checked configuration file.
type fileSettings struct {
	file fileConfig
	// interval and remove are health_interval and remove_after, zero
	// when the file does not set them.
	interval, remove time.Duration
	// loadReports is load_reports (router.LoadReportCapacities when the
	// file does not set it).
	loadReports router.LoadReportMode
}

// decodeConfig reads and checks a JSON configuration file: one object of
// fileConfig's fields, no other field and nothing after it. Every error is
// a *configError naming the setting at fault (or the byte where the JSON
// breaks).
func decodeConfig(raw []byte) (fileSettings, error) {
	var s fileSettings
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s.file); err != nil {
		return fileSettings{}, jsonError(err, dec.InputOffset())
	}
	if _, err := dec.Token(); err != io.EOF {
		return fileSettings{}, &configError{Offset: dec.InputOffset(), Err: errors.New("more data after the configuration object")}
	}
	if err := s.check(); err != nil {
		return fileSettings{}, err
	}
	return s, nil
}

// jsonError turns a decoding error into a *configError.
func jsonError(err error, offset int64) error {
	var (
		syntax *json.SyntaxError
		typ    *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &syntax):
		return &configError{Offset: syntax.Offset, Err: err}
	case errors.As(err, &typ) && typ.Field != "":
		return &configError{Field: typ.Field, Err: fmt.Errorf("JSON %s where %s is expected (byte %d)", typ.Value, jsonKind(typ.Type), typ.Offset)}
	case errors.As(err, &typ):
		return &configError{Offset: typ.Offset, Err: fmt.Errorf("JSON %s where the configuration object is expected", typ.Value)}
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if n, uerr := strconv.Unquote(name); uerr == nil {
			name = n
		}
		// The decoder names the key but not its path; an empty or odd key
		// is still named, quoted, by the message.
		return &configError{Field: name, Offset: offset, Err: fmt.Errorf("unknown field %q", name)}
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &configError{Offset: offset, Err: errors.New("unexpected end of the JSON")}
	}
	return &configError{Offset: offset, Err: err}
}

// jsonKind names the JSON value a Go type decodes from.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("an integer (%s)", t.Kind())
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// check checks the decoded settings and parses the durations.
func (s *fileSettings) check() error {
	c := &s.file
	bad := func(field string, format string, args ...any) error {
		return &configError{Field: field, Err: fmt.Errorf(format, args...)}
	}
	if c.Listen != "" {
		if _, port, err := net.SplitHostPort(c.Listen); err != nil || port == "" {
			return bad("listen", "%q is not host:port", c.Listen)
		}
	}
	if c.BlockSize < 0 || c.BlockSize > kvroute.MaxBlockSize {
		return bad("block_size", "%d is not between 1 and %d (0: the default)", c.BlockSize, kvroute.MaxBlockSize)
	}
	if c.TokenizeURL != "" {
		if u, err := url.Parse(c.TokenizeURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("tokenize_url", "%q is not http(s)://host[:port]", c.TokenizeURL)
		}
	}
	for _, d := range []struct {
		field string
		s     string
		dst   *time.Duration
		zero  bool // zero allowed
	}{{"health_interval", c.HealthInterval, &s.interval, false}, {"remove_after", c.RemoveAfter, &s.remove, true}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil {
			return bad(d.field, "%w", err)
		}
		if v < 0 || (v == 0 && !d.zero) {
			return bad(d.field, "%q is not a positive duration", d.s)
		}
		*d.dst = v
	}
	if c.MaxAttempts < 0 {
		return bad("max_attempts", "%d is negative (0: the default)", c.MaxAttempts)
	}
	if c.LoadReports != "" {
		if err := s.loadReports.UnmarshalText([]byte(c.LoadReports)); err != nil {
			return bad("load_reports", "%w", err)
		}
	}
	seen := make(map[kvroute.WorkerID]int, len(c.Engines))
	for i, e := range c.Engines {
		field := fmt.Sprintf("engines[%d]", i)
		if err := e.Validate(); err != nil {
			return &configError{Field: field, Err: err}
		}
		if j, dup := seen[e.ID]; dup {
			return bad(field, "id %d is also engines[%d]'s", e.ID, j)
		}
		seen[e.ID] = i
	}
	for model, adapter := range c.Adapters {
		if model == "" || adapter == "" {
			return bad(fmt.Sprintf("adapters[%q]", model), "an empty model or adapter name (%q: %q)", model, adapter)
		}
	}
	if c.Dynamo.Store == "" {
		if c.Dynamo != (dynamoConfig{}) {
			return bad("dynamo.store", "missing: the other dynamo settings need a store")
		}
		return nil
	}
	if err := c.Dynamo.validate(); err != nil {
		return &configError{Field: "dynamo", Err: err}
	}
	if err := c.Dynamo.frontend().Validate(); err != nil {
		return &configError{Field: "dynamo.frontend", Err: err}
	}
	return nil
}
