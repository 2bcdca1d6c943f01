package kvroute

import "fmt"

// Tier is the storage medium that holds a KV-cache block. Lower tiers are
// faster; the indexer counts a block a worker holds in several tiers at the
// fastest of them.
type Tier uint8

// The storage tiers, fastest first.
const (
	TierDevice   Tier = iota // accelerator memory (GPU HBM); the default
	TierHost                 // host DRAM (CPU offload)
	TierDisk                 // local disk or NVMe
	TierExternal             // remote or shared storage
)

// NumTiers is the number of storage tiers.
const NumTiers = 4

// Valid reports whether t is one of the defined tiers.
func (t Tier) Valid() bool { return t < NumTiers }

// String returns the lower-case tier name.
func (t Tier) String() string {
	switch t {
	case TierDevice:
		return "device"
	case TierHost:
		return "host"
	case TierDisk:
		return "disk"
	case TierExternal:
		return "external"
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}
