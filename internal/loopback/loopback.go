// Package loopback finds free TCP ports on 127.0.0.1 for tests and
// benchmarks that start other processes on them.
package loopback

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// firstPort is the lowest port FreePort returns.
const firstPort = 10000

// taken holds the ports this process has returned, so that it never
// returns one twice.
var taken sync.Map

// FreePort returns a loopback TCP port nobody listens on right now, below
// the kernel's ephemeral range when that leaves room: a port the caller
// passes to a process that binds it later cannot be given meanwhile to
// another process binding port 0 (as Dynamo's workers do for their event
// sockets), which happens with the port a listen on port 0 returns. It
// never returns a port twice in one process.
func FreePort() (int, error) { return FreePorts(1) }

// FreePorts returns the first of n consecutive free loopback TCP ports,
// chosen as FreePort chooses one, for a process that binds a port per
// rank from a base port. None of the n is returned again in this process.
func FreePorts(n int) (int, error) {
	if n < 1 {
		return 0, fmt.Errorf("loopback: %d ports asked for", n)
	}
	lo := ephemeralStart()
	for range 200 {
		var p int
		if lo-firstPort >= 1000+n {
			p = firstPort + rand.IntN(lo-firstPort-n+1)
		} else {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return 0, err
			}
			p = l.Addr().(*net.TCPAddr).Port
			l.Close()
		}
		if p+n-1 > 65535 || !reserve(p, n) {
			continue
		}
		if free(p, n) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("loopback: no %d free consecutive ports found in 200 tries", n)
}

// reserve marks ports [p, p+n) as returned and reports whether none of
// them was before.
func reserve(p, n int) bool {
	for i := range n {
		if _, dup := taken.LoadOrStore(p+i, true); dup {
			return false
		}
	}
	return true
}

// free reports whether ports [p, p+n) can all be listened on now.
func free(p, n int) bool {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+i))
		if err != nil {
			return false
		}
		held = append(held, l)
	}
	return true
}

// ephemeralStart returns the first port of the kernel's ephemeral range
// (Linux's ip_local_port_range), or 32768, its default, where it cannot
// be read.
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	var lo, hi int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &lo, &hi); err != nil || lo <= 0 {
		return 32768
	}
	return lo
}
