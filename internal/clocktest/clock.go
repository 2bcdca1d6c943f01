// Package clocktest provides a kvroute.Clock that tests move by hand.
package clocktest

import (
	"sync"
	"time"
)

// Clock is a kvroute.Clock whose time only changes through Advance and
// Set. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex // protects now
	now time.Time
}

// New returns a Clock reading start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}
