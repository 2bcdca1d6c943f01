package rawmem_test

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/transfer/internal/rawmem"
)

func TestBytesAddr(t *testing.T) {
	mem, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	defer func() { require.NoError(t, syscall.Munmap(mem)) }()
	addr := rawmem.Addr(mem)
	tests := []struct {
		off, n int
	}{{0, 4096}, {100, 1}, {4000, 96}}
	for _, tc := range tests {
		b := rawmem.Bytes(addr+uintptr(tc.off), uint64(tc.n))
		require.Len(t, b, tc.n)
		b[0] = byte(tc.off + 1)
		require.Equal(t, byte(tc.off+1), mem[tc.off])
		require.Equal(t, addr+uintptr(tc.off), rawmem.Addr(b))
	}
	require.Nil(t, rawmem.Bytes(addr, 0))
	require.Zero(t, rawmem.Addr(nil))
}
