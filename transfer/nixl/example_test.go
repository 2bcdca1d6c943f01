package nixl_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/kvroute/kvroute/transfer"
	"github.com/kvroute/kvroute/transfer/nixl"
	"github.com/kvroute/kvroute/transfer/tcp"
)

// Prefer NIXL, fall back to the pure-Go backend where it is not installed.
func ExampleNew() {
	var agent transfer.Agent
	a, err := nixl.New(nixl.Config{Name: "decode-0", Backends: []string{"UCX"}})
	switch {
	case err == nil:
		agent = a
	case errors.Is(err, transfer.ErrUnavailable):
		t, terr := tcp.New(tcp.Config{Name: "decode-0"})
		if terr != nil {
			log.Fatal(terr)
		}
		agent = t
	default:
		log.Fatal(err)
	}
	defer agent.Close()
	fmt.Println(agent.Name())
	// Output: decode-0
}
