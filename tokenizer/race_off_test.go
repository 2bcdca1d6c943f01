//go:build !race

package tokenizer_test

// raceEnabled reports whether the race detector is on.
const raceEnabled = false
