//go:build unix

package cputime

import "syscall"

// Process returns the CPU time (user and system) the process has used, in
// nanoseconds (microsecond resolution), and true; false where it cannot
// be read.
func Process() (int64, bool) { return usage(syscall.RUSAGE_SELF) }

// usage returns the user and system time getrusage reports for who.
func usage(who int) (int64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0, false
	}
	return ru.Utime.Nano() + ru.Stime.Nano(), true
}
