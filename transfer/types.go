package transfer

import (
	"fmt"
)

// MemKind is the kind of memory a descriptor list describes. The values
// equal NIXL's nixl_mem_t, so backends can pass them through.
type MemKind uint8

// The memory kinds, in NIXL's order.
const (
	DRAM   MemKind = iota // host memory
	VRAM                  // accelerator memory; DevID is the device index
	Block                 // a block device; DevID identifies it
	Object                // an object store; RegDesc.Meta holds the key
	File                  // a file; DevID is the file descriptor
)

// numMemKinds is the number of defined memory kinds.
const numMemKinds = 5

// Valid reports whether k is one of the defined kinds.
func (k MemKind) Valid() bool { return k < numMemKinds }

// String returns NIXL's name of the kind.
func (k MemKind) String() string {
	switch k {
	case DRAM:
		return "DRAM"
	case VRAM:
		return "VRAM"
	case Block:
		return "BLK"
	case Object:
		return "OBJ"
	case File:
		return "FILE"
	}
	return fmt.Sprintf("mem(%d)", uint8(k))
}

// Op is the direction of a transfer, seen from the initiator. The values
// equal NIXL's nixl_xfer_op_t.
type Op uint8

// The transfer operations.
const (
	// Read copies remote memory into local memory.
	Read Op = iota
	// Write copies local memory into remote memory.
	Write
)

// Valid reports whether o is Read or Write.
func (o Op) Valid() bool { return o <= Write }

// String returns "READ" or "WRITE".
func (o Op) String() string {
	switch o {
	case Read:
		return "READ"
	case Write:
		return "WRITE"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Status is the state of a transfer request.
type Status uint8

// The request states.
const (
	// StatusIdle: created or released, not posted.
	StatusIdle Status = iota
	// StatusInProgress: posted and not finished; poll again.
	StatusInProgress
	// StatusDone: every byte landed (and the notification, if any, was sent).
	StatusDone
	// StatusFailed: the transfer ended with an error; the request's error
	// says why. Destination memory may hold part of the data.
	StatusFailed
)

// String returns the status name.
func (s Status) String() string {
	switch s {
	case StatusIdle:
		return "idle"
	case StatusInProgress:
		return "in-progress"
	case StatusDone:
		return "done"
	case StatusFailed:
		return "failed"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Desc is one contiguous range of memory (NIXL's nixlBasicDesc). Addr is a
// virtual address for DRAM, a device pointer for VRAM, an offset for files
// and block devices.
type Desc struct {
	Addr  uintptr `json:"addr"`
	Len   uint64  `json:"len"`
	DevID uint64  `json:"dev"`
}

// End returns the address one past the range, and false when the range
// wraps around the address space.
func (d Desc) End() (uintptr, bool) {
	end := d.Addr + uintptr(d.Len)
	return end, uint64(end-d.Addr) == d.Len && end >= d.Addr
}

// Covers reports whether d holds all of q: same device and q's range
// inside d's.
func (d Desc) Covers(q Desc) bool {
	if d.DevID != q.DevID || q.Addr < d.Addr {
		return false
	}
	de, ok1 := d.End()
	qe, ok2 := q.End()
	return ok1 && ok2 && qe <= de
}

// RegDesc is a descriptor used to register memory (NIXL's nixlBlobDesc):
// a range plus backend-specific bytes such as an object key or file path.
type RegDesc struct {
	Desc
	Meta []byte `json:"meta,omitempty"`
}

// DescList is a list of transfer descriptors of one memory kind (NIXL's
// nixl_xfer_dlist_t). The slice is borrowed for the duration of the call it
// is passed to.
type DescList struct {
	Kind  MemKind
	Descs []Desc
}

// Bytes returns the total length of the descriptors.
func (l DescList) Bytes() uint64 {
	var n uint64
	for _, d := range l.Descs {
		n += d.Len
	}
	return n
}

// RegList is a list of registration descriptors of one memory kind (NIXL's
// nixl_reg_dlist_t).
type RegList struct {
	Kind  MemKind
	Descs []RegDesc
}

// Notif is a notification one agent received from another.
type Notif struct {
	// From is the name of the agent that sent it (the transfer's initiator).
	From string
	// Msg is the message. It is owned by the receiver.
	Msg []byte
}

// RequestOptions are the optional arguments of a transfer request (NIXL's
// nixl_opt_args_t). A nil *RequestOptions means no notification and any
// backend.
type RequestOptions struct {
	// Notif, when non-nil, is sent to the remote agent after the data has
	// landed; the remote sees it in Agent.Notifs keyed by this agent's name.
	// A non-nil empty slice sends an empty notification.
	Notif []byte
	// Backends restricts the request to these backends. Empty means any.
	Backends []Backend
	// SkipDescMerge asks the backend not to merge adjacent descriptors.
	SkipDescMerge bool
}
