//go:build amd64 && !race

package indexer

import (
	"sync/atomic"
	"unsafe"
)

// The index's writer publishes to its lock-free readers with the
// functions below. A reader needs only what a release store gives: that
// it sees what the writer wrote before the store it observes. On amd64
// every store is a release store (stores are not reordered with older
// stores, and the compiler keeps the order of the program's stores), so
// they are plain moves there, where sync/atomic's sequentially
// consistent stores are locked exchanges that wait for the CPU's store
// buffer to drain: with them, a trace replay of stores and evictions took
// about 5% longer. Elsewhere, and under the race detector, which checks
// the index's lock-free reads, they are sync/atomic's stores.

// The functions below store into the value a sync/atomic type wraps, its
// only field, at offset zero; these fail to compile if a type ever holds
// more than that value.
var (
	_ [unsafe.Sizeof(atomic.Pointer[chunk]{}) - unsafe.Sizeof(unsafe.Pointer(nil))]struct{}
	_ [unsafe.Sizeof(unsafe.Pointer(nil)) - unsafe.Sizeof(atomic.Pointer[chunk]{})]struct{}
	_ [unsafe.Sizeof(atomic.Uint64{}) - 8]struct{}
	_ [8 - unsafe.Sizeof(atomic.Uint64{})]struct{}
	_ [unsafe.Sizeof(atomic.Int64{}) - 8]struct{}
	_ [8 - unsafe.Sizeof(atomic.Int64{})]struct{}
	_ [unsafe.Sizeof(atomic.Int32{}) - 4]struct{}
	_ [4 - unsafe.Sizeof(atomic.Int32{})]struct{}
	_ [unsafe.Sizeof(atomic.Uint32{}) - 4]struct{}
	_ [4 - unsafe.Sizeof(atomic.Uint32{})]struct{}
)

// publishPointer stores v in p for lock-free readers.
func publishPointer[T any](p *atomic.Pointer[T], v *T) {
	*(*unsafe.Pointer)(unsafe.Pointer(p)) = unsafe.Pointer(v)
}

// publishUint64 stores v in p for lock-free readers.
func publishUint64(p *atomic.Uint64, v uint64) { *(*uint64)(unsafe.Pointer(p)) = v }

// publishInt64 stores v in p for lock-free readers.
func publishInt64(p *atomic.Int64, v int64) { *(*int64)(unsafe.Pointer(p)) = v }

// publishInt32 stores v in p for lock-free readers.
func publishInt32(p *atomic.Int32, v int32) { *(*int32)(unsafe.Pointer(p)) = v }

// publishUint32 stores v in p for lock-free readers.
func publishUint32(p *atomic.Uint32, v uint32) { *(*uint32)(unsafe.Pointer(p)) = v }
