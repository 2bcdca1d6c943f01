package kvroute

import "time"

// Clock supplies the current time. Packages that expire or age state take a
// Clock in their configuration, so tests can drive time by hand; a nil
// Clock means SystemClock.
type Clock interface {
	Now() time.Time
}

// SystemClock is the Clock that reads the system time.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// ClockOrSystem returns c, or SystemClock when c is nil.
func ClockOrSystem(c Clock) Clock {
	if c == nil {
		return SystemClock{}
	}
	return c
}
