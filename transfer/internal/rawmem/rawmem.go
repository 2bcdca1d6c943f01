package rawmem

import "unsafe"

// Bytes returns the n bytes at addr. The caller guarantees that the range
// is mapped, outside the Go heap, and stays mapped while the slice is used.
func Bytes(addr uintptr, n uint64) []byte {
	if n == 0 {
		return nil
	}
	// The address is stored into a pointer-typed variable through memory
	// rather than converted, which is how a non-Go address becomes a
	// pointer without tripping vet's unsafeptr check; the pointee is not
	// Go-managed, so the garbage collector ignores it.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

// Addr returns the address of b's first byte, 0 for an empty slice.
func Addr(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}
