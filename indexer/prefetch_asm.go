//go:build amd64 || arm64

package indexer

import "unsafe"

// prefetchLine asks the CPU to bring the cache line holding p into its
// caches, without waiting for it: a hint that never faults, whatever p
// is. A plain load would do the same but hold back the instructions after
// it until its line arrives, so that only a few misses overlap.
//
//go:noescape
func prefetchLine(p unsafe.Pointer)
