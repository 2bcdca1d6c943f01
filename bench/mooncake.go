package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"
)

// MooncakeBlockTokens is the number of tokens per hash id in Mooncake
// traces.
const MooncakeBlockTokens = 512

// maxTraceLine bounds one JSONL line of a trace (the longest line of the
// published trace is under 3 KB; a 1 MiB line is 100,000 hash ids).
const maxTraceLine = 1 << 20

// TraceRecord is one request of a Mooncake trace (kvcache-ai/Mooncake,
// FAST'25 trace release): one JSON object per line.
type TraceRecord struct {
	// Timestamp is the arrival time in milliseconds from the start of the
	// trace.
	Timestamp int64 `json:"timestamp"`
	// InputLength and OutputLength are the prompt and output lengths in
	// tokens.
	InputLength  int `json:"input_length"`
	OutputLength int `json:"output_length"`
	// HashIDs name the prompt's blocks of MooncakeBlockTokens tokens:
	// equal ids at equal positions are equal blocks. The last block may be
	// partial.
	HashIDs []int64 `json:"hash_ids"`
}

// ReadMooncake parses a Mooncake JSONL trace. Blank lines are skipped.
// Errors wrap ErrTrace and name the line.
func ReadMooncake(r io.Reader) ([]TraceRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTraceLine)
	var out []TraceRecord
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(trimSpace(b)) == 0 {
			continue
		}
		var rec TraceRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, line, err)
		}
		if err := rec.validate(); err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, line, err)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: line longer than %d bytes", ErrTrace, maxTraceLine)
		}
		return nil, fmt.Errorf("%w: %w", ErrTrace, err)
	}
	return out, nil
}

// ReadMooncakeFile parses the Mooncake JSONL trace at path.
func ReadMooncakeFile(path string) ([]TraceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer f.Close()
	return ReadMooncake(f)
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

func (r *TraceRecord) validate() error {
	switch {
	case r.Timestamp < 0:
		return fmt.Errorf("negative timestamp %d", r.Timestamp)
	case r.InputLength <= 0:
		return fmt.Errorf("input_length %d is not positive", r.InputLength)
	case r.OutputLength < 0:
		return fmt.Errorf("negative output_length %d", r.OutputLength)
	case len(r.HashIDs) == 0:
		return errors.New("no hash_ids")
	case len(r.HashIDs) != (r.InputLength+MooncakeBlockTokens-1)/MooncakeBlockTokens:
		return fmt.Errorf("%d hash_ids for input_length %d (want %d)", len(r.HashIDs), r.InputLength,
			(r.InputLength+MooncakeBlockTokens-1)/MooncakeBlockTokens)
	}
	return nil
}

// MooncakeConfig configures the replay of a Mooncake trace.
type MooncakeConfig struct {
	// Speed divides the trace's timestamps: 2 replays it twice as fast.
	// Zero means 1.
	Speed float64
	// Limit keeps only the first Limit records. Zero keeps all.
	Limit int
	// MaxInputTokens drops records whose prompt is longer. Zero keeps all.
	MaxInputTokens int
}

// FromMooncake turns trace records into a workload: each hash id becomes
// MooncakeBlockTokens synthetic token ids that are a pure function of the id
// (so equal ids give equal blocks at any engine block size that divides
// 512), the last block is cut to the input length, and arrivals are the
// timestamps divided by the speed factor. Records are taken in file order;
// a record earlier than the one before it arrives with it.
func FromMooncake(records []TraceRecord, cfg MooncakeConfig) (*Workload, error) {
	setDefault(&cfg.Speed, 1)
	if !(cfg.Speed > 0) || cfg.Limit < 0 || cfg.MaxInputTokens < 0 {
		return nil, fmt.Errorf("%w: mooncake speed %g, limit %d, max input %d", ErrInvalidConfig, cfg.Speed, cfg.Limit, cfg.MaxInputTokens)
	}
	if cfg.Limit > 0 && cfg.Limit < len(records) {
		records = records[:cfg.Limit]
	}
	w := &Workload{Name: "mooncake", Requests: make([]Request, 0, len(records))}
	var last time.Duration
	for i := range records {
		rec := &records[i]
		if err := rec.validate(); err != nil {
			return nil, fmt.Errorf("%w: record %d: %w", ErrTrace, i, err)
		}
		if cfg.MaxInputTokens > 0 && rec.InputLength > cfg.MaxInputTokens {
			continue
		}
		at := max(arrival(rec.Timestamp, cfg.Speed), last)
		last = at
		p := make(Prompt, len(rec.HashIDs))
		left := rec.InputLength
		for j, id := range rec.HashIDs {
			n := min(left, MooncakeBlockTokens)
			p[j] = Segment{Seed: seedOf(kindTraceBlock, uint64(id), 0), Len: n}
			left -= n
		}
		w.Requests = append(w.Requests, Request{
			Arrival: at,
			Prompt:  p,
			Output:  Segment{Seed: seedOf(kindOutput, uint64(i), 0x6d6f6f6e), Len: max(rec.OutputLength, 1)},
		})
	}
	return w, nil
}

// arrival returns the arrival time of a record at timestamp ms replayed at
// speed, saturated at the longest time.Duration (a float64 beyond it
// would convert to an arbitrary Duration).
func arrival(ms int64, speed float64) time.Duration {
	ns := float64(ms) * float64(time.Millisecond) / speed
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}
