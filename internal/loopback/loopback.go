// Package loopback finds free TCP ports on 127.0.0.1 for tests and
// benchmarks that start other processes on them.
package loopback

import (
	"errors"
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
func FreePort() (int, error) {
	lo := ephemeralStart()
	for range 200 {
		var p int
		if lo-firstPort >= 1000 {
			p = firstPort + rand.IntN(lo-firstPort)
		} else {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return 0, err
			}
			p = l.Addr().(*net.TCPAddr).Port
			l.Close()
		}
		if _, dup := taken.LoadOrStore(p, true); dup {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue // in use
		}
		l.Close()
		return p, nil
	}
	return 0, errors.New("loopback: no free port found in 200 tries")
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
