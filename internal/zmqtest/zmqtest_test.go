package zmqtest_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/zmqtest"
)

func TestRankPublishersBindConsecutivePorts(t *testing.T) {
	socks, first := zmqtest.RankPublishers(t, 3)
	require.Len(t, socks, 3)
	require.Equal(t, "tcp://"+socks[0].Addr().String(), first)
	port := func(i int) int {
		a := socks[i].Addr().String()
		p, err := strconv.Atoi(a[strings.LastIndexByte(a, ':')+1:])
		require.NoError(t, err)
		return p
	}
	for r := 1; r < 3; r++ {
		require.Equal(t, port(0)+r, port(r), "rank %d", r)
	}
}
