//go:build !unix

package cputime

// Process reports false: the process's CPU time is read on Unix systems
// only.
func Process() (int64, bool) { return 0, false }
