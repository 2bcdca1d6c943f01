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

// FreePorts returns runs of consecutive ports that can all be listened
// on and never overlap one another or FreePort's.
func TestFreePorts(t *testing.T) {
	seen := map[int]bool{}
	for _, n := range []int{1, 2, 4, 8, 3} {
		base, err := FreePorts(n)
		if err != nil {
			t.Fatal(err)
		}
		for p := base; p < base+n; p++ {
			if seen[p] {
				t.Fatalf("port %d returned twice", p)
			}
			seen[p] = true
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				t.Fatalf("port %d of %d from %d: %v", p-base+1, n, base, err)
			}
			l.Close()
		}
	}
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if seen[p] {
		t.Fatalf("FreePort returned %d, part of a run", p)
	}
	if _, err := FreePorts(0); err == nil {
		t.Fatal("FreePorts(0) returned no error")
	}
}
