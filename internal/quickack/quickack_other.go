//go:build !linux

package quickack

import (
	"errors"
	"net"
	"syscall"
)

// Wrap returns c: only Linux has TCP_QUICKACK.
func Wrap(c net.Conn) net.Conn { return c }

// Armed reports errors.ErrUnsupported: only Linux has TCP_QUICKACK.
func Armed(syscall.Conn) (bool, error) { return false, errors.ErrUnsupported }
