package main

import (
	"fmt"

	"github.com/kvroute/kvroute/internal/cputime"
)

// The clocks the ratios can compare (-clock).
const (
	// clockWall is the elapsed time of each timed section.
	clockWall = "wall"
	// clockCPU is the CPU time of each side's process over the section,
	// all threads counted (kvroute's garbage collector included). Other
	// jobs on a shared machine delay a side without adding to it, so it
	// varies much less than the elapsed time on a busy machine; they
	// still slow it through the caches they share.
	clockCPU = "cpu"
)

// clockText names the clock for the report's header.
func clockText(clock string) string {
	if clock == clockCPU {
		return "process CPU"
	}
	return "elapsed"
}

// useCPUTime makes res's sections report their CPU time instead of their
// elapsed time.
func useCPUTime(res *sideResult) error {
	for i := range res.Sections {
		r := &res.Sections[i]
		if r.Timed && r.CPUNS <= 0 {
			return fmt.Errorf("peers: %s reported no CPU time for section %s", res.Side, r.Name)
		}
		r.NS = r.CPUNS
	}
	return nil
}

// processCPU returns the CPU time this process has used, user and system,
// in nanoseconds (microsecond resolution), or 0 when it is unavailable.
func processCPU() int64 {
	ns, _ := cputime.Process()
	return ns
}
