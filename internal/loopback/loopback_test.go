package loopback

import (
	"net"
	"strconv"
	"testing"
)

// FreePort returns distinct ports that can be listened on, below the
// ephemeral range.
func TestFreePort(t *testing.T) {
	seen := map[int]bool{}
	lo := ephemeralStart()
	for range 50 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d returned twice", p)
		}
		seen[p] = true
		if lo-firstPort >= 1000 && (p < firstPort || p >= lo) {
			t.Fatalf("port %d outside [%d, %d)", p, firstPort, lo)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		l.Close()
	}
}
