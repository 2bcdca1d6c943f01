package scheduling_test

import (
	"time"

	"github.com/kvroute/kvroute/internal/clocktest"
)

// newManualClock returns a kvroute.Clock that moves only when told to.
func newManualClock() *clocktest.Clock {
	return clocktest.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
}
