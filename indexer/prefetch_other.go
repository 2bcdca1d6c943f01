//go:build !amd64 && !arm64

package indexer

import "unsafe"

// prefetchLines2 would ask the CPU for the cache lines holding a and b.
// This architecture has no prefetch instruction wired in: lookups then
// miss one by one, with the same results.
func prefetchLines2(a, b unsafe.Pointer) {}

// prefetchLines3 is prefetchLines2 for three lines.
func prefetchLines3(a, b, c unsafe.Pointer) {}
