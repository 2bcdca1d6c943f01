//go:build !unix

package transfer

import "fmt"

func mapMemory(int) ([]byte, error) {
	return nil, fmt.Errorf("%w: anonymous memory mapping on this platform", ErrNotSupported)
}

func unmapMemory([]byte) error { return nil }
