//go:build !amd64 || race

package indexer

import "sync/atomic"

// See publish_tso.go.

// publishPointer stores v in p for lock-free readers.
func publishPointer[T any](p *atomic.Pointer[T], v *T) { p.Store(v) }

// publishUint64 stores v in p for lock-free readers.
func publishUint64(p *atomic.Uint64, v uint64) { p.Store(v) }

// publishInt64 stores v in p for lock-free readers.
func publishInt64(p *atomic.Int64, v int64) { p.Store(v) }

// publishInt32 stores v in p for lock-free readers.
func publishInt32(p *atomic.Int32, v int32) { p.Store(v) }

// publishUint32 stores v in p for lock-free readers.
func publishUint32(p *atomic.Uint32, v uint32) { p.Store(v) }
