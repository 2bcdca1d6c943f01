//go:build linux

package natsx

import "syscall"

// processCPU returns the CPU time (user and system) the process used, in
// nanoseconds (microsecond resolution), and true.
func processCPU() (int64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return ru.Utime.Nano() + ru.Stime.Nano(), true
}
