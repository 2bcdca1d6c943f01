//go:build !cgo

package nixl

import (
	"fmt"

	"github.com/kvroute/kvroute/transfer"
)

// Agent is a transfer.Agent backed by NIXL. This build has no cgo, so New
// always fails and no Agent value exists.
type Agent struct{ transfer.Agent }

// New returns an error wrapping transfer.ErrUnavailable: this binary was
// built with CGO_ENABLED=0, and loading NIXL needs cgo.
func New(cfg Config) (*Agent, error) {
	return nil, fmt.Errorf("%w: nixl: built without cgo (CGO_ENABLED=0); rebuild with a C compiler to load %s", transfer.ErrUnavailable, LibName)
}
