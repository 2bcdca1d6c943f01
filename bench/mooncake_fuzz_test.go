package bench

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
)

// FuzzReadMooncake reads arbitrary text as a Mooncake trace and replays
// what it accepts. A rejected trace is an ErrTrace error naming the line
// (or the over-long line); an accepted one gives one valid record per
// non-blank line, and a workload whose prompts are exactly the records'
// input lengths in blocks of at most MooncakeBlockTokens, with arrivals
// that never go back in time.
func FuzzReadMooncake(f *testing.F) {
	sample, err := os.ReadFile("testdata/mooncake_sample.jsonl")
	if err != nil {
		f.Fatal(err)
	}
	lines := bytes.SplitAfter(sample, []byte("\n"))
	f.Add(bytes.Join(lines[:min(3, len(lines))], nil))
	f.Add(lines[0])
	f.Add([]byte(`{"timestamp": 9223372036854775807, "input_length": 1, "output_length": 0, "hash_ids": [5]}` + "\n"))
	f.Add([]byte(`{"timestamp": 1, "input_length": 513, "output_length": 1, "hash_ids": [1, -1]}` + "\n\n  \r\n"))
	f.Add([]byte(`{"timestamp": 1, "input_length": 9223372036854775807, "hash_ids": [1]}`))
	f.Add([]byte("{\"hash_ids\": [1]}\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		recs, err := ReadMooncake(bytes.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), "line") {
				t.Fatalf("error %q does not wrap ErrTrace or name the line", err)
			}
			return
		}
		nonBlank := 0
		for _, l := range bytes.Split(in, []byte("\n")) {
			if len(trimSpace(l)) > 0 {
				nonBlank++
			}
		}
		if len(recs) != nonBlank {
			t.Fatalf("%d records from %d non-blank lines", len(recs), nonBlank)
		}
		for _, speed := range []float64{1, 1e-300} {
			w, err := FromMooncake(recs, MooncakeConfig{Speed: speed})
			if err != nil {
				t.Fatalf("replay of accepted records: %v", err)
			}
			if len(w.Requests) != len(recs) {
				t.Fatalf("%d requests for %d records", len(w.Requests), len(recs))
			}
			for i, r := range w.Requests {
				if r.Arrival < 0 || i > 0 && r.Arrival < w.Requests[i-1].Arrival {
					t.Fatalf("request %d arrives at %v (speed %g, timestamp %d)", i, r.Arrival, speed, recs[i].Timestamp)
				}
				if recs[i].Timestamp > 0 && r.Arrival == 0 {
					t.Fatalf("request %d of timestamp %d arrives at 0 (speed %g)", i, recs[i].Timestamp, speed)
				}
				n := 0
				for _, s := range r.Prompt {
					if s.Len <= 0 || s.Len > MooncakeBlockTokens {
						t.Fatalf("request %d: block of %d tokens", i, s.Len)
					}
					n += s.Len
				}
				if n != recs[i].InputLength {
					t.Fatalf("request %d: %d prompt tokens for input_length %d", i, n, recs[i].InputLength)
				}
			}
		}
	})
}
