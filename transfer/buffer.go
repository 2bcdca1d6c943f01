package transfer

import (
	"fmt"
	"sync"
	"unsafe"
)

// Buffer is host memory outside the Go heap, for registering with an agent.
// Backends and native libraries keep pointers to registered memory, which
// cgo's rules forbid for Go memory, and the garbage collector must never
// move or free it under a transfer: a Buffer is mmap-backed and lives until
// Free.
//
// Bytes and Desc may be used from any goroutine; Free must not race with
// transfers into or out of the buffer (deregister it first).
type Buffer struct {
	mu   sync.Mutex // protects mem against a concurrent Free
	mem  []byte
	addr uintptr
	size int
}

// AllocBuffer maps n bytes of zeroed, page-aligned host memory. Errors:
// ErrInvalidParam for n <= 0, or the operating system's error.
func AllocBuffer(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: buffer size %d", ErrInvalidParam, n)
	}
	mem, err := mapMemory(n)
	if err != nil {
		return nil, fmt.Errorf("transfer: map %d bytes: %w", n, err)
	}
	return &Buffer{mem: mem, addr: uintptr(unsafe.Pointer(&mem[0])), size: n}, nil
}

// Bytes returns the buffer's memory. It is valid until Free; it is nil
// after Free.
func (b *Buffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mem
}

// Addr returns the address of the first byte.
func (b *Buffer) Addr() uintptr { return b.addr }

// Len returns the size in bytes.
func (b *Buffer) Len() int { return b.size }

// Desc returns a descriptor of the bytes [off, off+n) of the buffer, for
// DRAM device 0. It does not check the range; agents do.
func (b *Buffer) Desc(off, n int) Desc {
	return Desc{Addr: b.addr + uintptr(off), Len: uint64(n)}
}

// RegList returns the registration list of the whole buffer as DRAM.
func (b *Buffer) RegList() RegList {
	return RegList{Kind: DRAM, Descs: []RegDesc{{Desc: b.Desc(0, b.size)}}}
}

// Free unmaps the memory. Deregister it from every agent first. A second
// Free returns ErrReleased.
func (b *Buffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mem == nil {
		return fmt.Errorf("%w: buffer already freed", ErrReleased)
	}
	err := unmapMemory(b.mem)
	b.mem = nil
	if err != nil {
		return fmt.Errorf("transfer: unmap: %w", err)
	}
	return nil
}
