//go:build !linux

package tcp_test

// threadCPU reports false: the thread's CPU time is read on Linux only.
func threadCPU() (int64, bool) { return 0, false }
