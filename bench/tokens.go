package bench

// Vocabulary is the number of distinct synthetic token ids. It is the size
// of a Llama-2 vocabulary, so token ids stay below 2^16 and encode in three
// msgpack bytes, as real ones do.
const Vocabulary = 32000

// Segment is a run of synthetic token ids that is a pure function of its
// seed: token i of a segment is tokenAt(Seed, i). Two segments with the same
// seed start with the same tokens, so prompts built from shared segments
// share KV-cache blocks exactly where they share segments.
type Segment struct {
	// Seed names the segment's content.
	Seed uint64
	// Len is the number of tokens.
	Len int
}

// AppendTokens appends the segment's token ids to dst.
func (s Segment) AppendTokens(dst []uint32) []uint32 {
	for i := range s.Len {
		dst = append(dst, tokenAt(s.Seed, i))
	}
	return dst
}

// Prompt is a prompt described by its segments, in order. Workloads keep
// prompts in this form (a few words per segment) and materialise token ids
// only when a request is routed or an engine publishes its blocks.
type Prompt []Segment

// Len returns the prompt's length in tokens.
func (p Prompt) Len() int {
	n := 0
	for _, s := range p {
		n += s.Len
	}
	return n
}

// AppendTokens appends the prompt's token ids to dst.
func (p Prompt) AppendTokens(dst []uint32) []uint32 {
	for _, s := range p {
		dst = s.AppendTokens(dst)
	}
	return dst
}

// tokenAt is token i of the segment with the given seed.
func tokenAt(seed uint64, i int) uint32 {
	return uint32(mix64(seed+uint64(i)*0x9e3779b97f4a7c15) % Vocabulary)
}

// mix64 is SplitMix64's finaliser: a bijective scramble of 64 bits.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// seedOf derives the seed of a named segment: the kind of content (a
// workload constant), and up to two indices.
func seedOf(kind, a, b uint64) uint64 {
	return mix64(mix64(kind^0x6b76726f757465)+a) ^ mix64(b+0x5bd1e995)
}

// setDefault sets *p to def when it is the zero value: "zero means the
// default" for configuration fields.
func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}
