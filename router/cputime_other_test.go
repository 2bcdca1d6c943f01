//go:build !linux

package router_test

const (
	rusageThread = 1
	rusageSelf   = 0
)

// cpuTime is not available here: it returns false.
func cpuTime(int) (int64, bool) { return 0, false }
