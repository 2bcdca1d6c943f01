package kvroute_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
)

type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }

func TestClockOrSystem(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	require.Equal(t, at, kvroute.ClockOrSystem(fixedClock(at)).Now())
	before := time.Now()
	now := kvroute.ClockOrSystem(nil).Now()
	require.False(t, now.Before(before))
}
