//go:build amd64 || arm64

package indexer

import "unsafe"

// prefetchLines2 asks the CPU to bring the cache lines holding a and b
// into its caches, without waiting for them: a hint that never faults,
// whatever the pointers are. A plain load would do the same but hold back
// the instructions after it until its line arrives, so that only a few
// misses overlap. The lines are asked for in one call because an assembly
// function is never inlined: a call per line would cost more than the
// hint.
//
//go:noescape
func prefetchLines2(a, b unsafe.Pointer)

// prefetchLines3 is prefetchLines2 for three lines.
//
//go:noescape
func prefetchLines3(a, b, c unsafe.Pointer)
