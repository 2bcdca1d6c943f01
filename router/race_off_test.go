//go:build !race

package router_test

// raceEnabled reports whether the race detector is on.
const raceEnabled = false
