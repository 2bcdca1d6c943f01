//go:build unix

package main

import "syscall"

// processCPU returns the CPU time this process has used, user and system,
// in nanoseconds (microsecond resolution), or 0 when it is unavailable.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
