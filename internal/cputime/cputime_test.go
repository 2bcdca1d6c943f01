package cputime_test

import (
	"runtime"
	"testing"

	"github.com/kvroute/kvroute/internal/cputime"
)

// TestCPUTimeGrows: the thread's and the process's CPU time grow with
// work done on the thread, and the process's is at least the thread's.
func TestCPUTimeGrows(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p0, okP := cputime.Process()
	t0, okT := cputime.Thread()
	if !okP && !okT {
		t.Skip("CPU time is not read on " + runtime.GOOS)
	}
	x := uint64(1)
	for {
		for range 1 << 20 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		p1, _ := cputime.Process()
		t1, _ := cputime.Thread()
		if (!okP || p1 > p0) && (!okT || t1 > t0) {
			if okP && okT && p1 < t1 {
				t.Fatalf("process CPU %d ns below the thread's %d ns", p1, t1)
			}
			break
		}
	}
	if x == 0 {
		t.Log(x) // keeps the loop
	}
}
