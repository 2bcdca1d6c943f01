//go:build linux

package cputime

// rusageThread is Linux's RUSAGE_THREAD: the calling thread's usage.
const rusageThread = 1

// Thread returns the CPU time (user and system) the calling thread has
// used, in nanoseconds (microsecond resolution), and true; false where it
// cannot be read (systems other than Linux). The caller locks itself to
// its thread (runtime.LockOSThread) for the reading to mean anything.
func Thread() (int64, bool) { return usage(rusageThread) }
