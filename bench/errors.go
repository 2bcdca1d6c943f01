package bench

import "errors"

// Errors returned by this package. Errors wrap one of them; test with
// errors.Is.
var (
	// ErrInvalidConfig: a configuration value is out of range. Fix the
	// configuration; retrying does not help.
	ErrInvalidConfig = errors.New("bench: invalid configuration")
	// ErrTrace: a trace file is malformed. The error names the line.
	ErrTrace = errors.New("bench: malformed trace")
)
