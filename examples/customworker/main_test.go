package main

import (
	"context"
	"os"
)

// The system prompt's requests go to the engine that cached it; the
// unrelated prompt goes to the idle one.
func Example() {
	if err := run(context.Background(), os.Stdout); err != nil {
		panic(err)
	}
	// Output:
	// gpu-a cached the system prompt: 16 blocks in the index
	// system prompt + question 1  → gpu-a (predicted cached 256 of 272 tokens)
	// unrelated prompt            → gpu-b (predicted cached 0 of 272 tokens)
	// system prompt + question 2  → gpu-a (predicted cached 256 of 272 tokens)
}
