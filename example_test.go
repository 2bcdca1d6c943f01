package kvroute_test

import (
	"fmt"

	"github.com/kvroute/kvroute"
)

func ExampleHasher() {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	seqs := h.AppendSeqHashes(nil, []uint32{0, 1, 2, 3, 4, 5, 6, 7, 8})
	fmt.Println(len(seqs), "blocks")
	// Output: 2 blocks
}

func ExampleHasher_WithSalt() {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	prompt := []uint32{0, 1, 2, 3, 4, 5, 6, 7}
	tenantA := h.WithSalt("tenant-a").AppendSeqHashes(nil, prompt)
	tenantB := h.WithSalt("tenant-b").AppendSeqHashes(nil, prompt)
	fmt.Println(tenantA[0] == tenantB[0])
	// Output: false
}

func ExampleHasher_AppendSeqHashesMM() {
	h := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	const pad = 151655 // the image placeholder token
	prompt := []uint32{1, 2, 3, 4, pad, pad, pad, pad, 5, 6, 7, 8}
	// vLLM's identifier of each image (a SHA-256 hex digest).
	a, _ := kvroute.MMIdentifierHash("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	b, _ := kvroute.MMIdentifierHash("fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210")
	withA := h.AppendSeqHashesMM(nil, prompt, []kvroute.MMObject{{Hash: a, Offset: 4, Length: 4}})
	withB := h.AppendSeqHashesMM(nil, prompt, []kvroute.MMObject{{Hash: b, Offset: 4, Length: 4}})
	// The text before the image is shared; from the image on, nothing is.
	fmt.Println(withA[0] == withB[0], withA[1] == withB[1], withA[2] == withB[2])
	// Output: true false false
}
