package tcp

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/transfer"
)

// TestNotifQueueDropsOldest fills the notification queue past
// MaxQueuedNotifs in several shapes: Notifs must return the newest
// MaxQueuedNotifs, in arrival order.
func TestNotifQueueDropsOldest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		max, sent int
	}{
		{"under the bound", 8, 5},
		{"at the bound", 8, 8},
		{"one past", 8, 9},
		{"far past", 8, 1000},
		{"bound of one", 1, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(Config{Name: "a", MaxQueuedNotifs: tc.max})
			require.NoError(t, err)
			defer a.Close()
			for round := range 2 {
				for i := range tc.sent {
					a.deliver("b", []byte(fmt.Sprint(round, "-", i)))
				}
				got, err := a.Notifs()
				require.NoError(t, err)
				var want []transfer.Notif
				for i := max(0, tc.sent-tc.max); i < tc.sent; i++ {
					want = append(want, transfer.Notif{From: "b", Msg: []byte(fmt.Sprint(round, "-", i))})
				}
				require.Equal(t, want, got, "round %d", round)
			}
		})
	}
}

// BenchmarkDeliverToFullQueue delivers notifications to an agent whose
// queue is full (a host that does not take them): each drops the oldest.
// The cost must not grow with MaxQueuedNotifs, since deliver holds the
// agent's lock.
func BenchmarkDeliverToFullQueue(b *testing.B) {
	for _, n := range []int{1 << 10, 1 << 16} {
		b.Run(fmt.Sprintf("max=%d", n), func(b *testing.B) {
			a, err := New(Config{Name: "a", MaxQueuedNotifs: n})
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			msg := []byte("request-42")
			for range n {
				a.deliver("b", msg)
			}
			b.ReportAllocs()
			for b.Loop() {
				a.deliver("b", msg)
			}
		})
	}
}
