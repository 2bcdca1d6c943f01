//go:build !linux

package cputime

// Thread reports false: the thread's CPU time is read on Linux only.
func Thread() (int64, bool) { return 0, false }
