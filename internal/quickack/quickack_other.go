//go:build !linux

package quickack

import "net"

// Supported reports whether Wrap changes anything on this system.
const Supported = false

// Wrap returns c: only Linux has TCP_QUICKACK.
func Wrap(c net.Conn) net.Conn { return c }
