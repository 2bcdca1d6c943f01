//go:build linux

package router_test

import "syscall"

// Linux's getrusage targets: the calling thread, and the whole process.
const (
	rusageThread = 1
	rusageSelf   = 0
)

// cpuTime returns the CPU time (user and system) used by the calling
// thread (who = rusageThread; the caller locks itself to its thread) or by
// the process (rusageSelf), in nanoseconds (microsecond resolution), and
// true.
func cpuTime(who int) (int64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0, false
	}
	return ru.Utime.Nano() + ru.Stime.Nano(), true
}
