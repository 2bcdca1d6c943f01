package clocktest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/clocktest"
)

func TestClock(t *testing.T) {
	start := time.Unix(100, 0)
	var c kvroute.Clock = clocktest.New(start)
	require.Equal(t, start, c.Now())
	c.(*clocktest.Clock).Advance(time.Second)
	require.Equal(t, start.Add(time.Second), c.Now())
	c.(*clocktest.Clock).Set(start)
	require.Equal(t, start, c.Now())
}
