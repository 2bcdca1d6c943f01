// Package rawmem turns addresses of memory outside the Go heap into byte
// slices.
//
// Transfer backends receive memory as addresses (uintptr), because the
// memory is mmap'd, allocated by C, or owned by a device runtime; Go's
// garbage collector never moves or frees it. Bytes is the one place where
// such an address becomes a []byte.
//
// # Usage
//
// A backend checks that a descriptor lies inside registered memory, then
// reads or writes it in place:
//
//	_, err := io.ReadFull(conn, rawmem.Bytes(d.Addr, d.Len))
package rawmem
