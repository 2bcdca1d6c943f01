//go:build !linux

package natsx

// processCPU is not available here: it returns false.
func processCPU() (int64, bool) { return 0, false }
