package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWorkloadsAreDeterministic(t *testing.T) {
	gens := []struct {
		name string
		gen  func(seed uint64) (*Workload, error)
	}{
		{"shared-prefix", func(s uint64) (*Workload, error) { return SharedPrefix(SharedPrefixConfig{Requests: 300, Seed: s}) }},
		{"chat", func(s uint64) (*Workload, error) { return Chat(ChatConfig{Requests: 300, Seed: s}) }},
		{"agentic", func(s uint64) (*Workload, error) { return Agentic(AgenticConfig{Requests: 300, Seed: s}) }},
	}
	for _, g := range gens {
		t.Run(g.name, func(t *testing.T) {
			a, err := g.gen(7)
			require.NoError(t, err)
			b, err := g.gen(7)
			require.NoError(t, err)
			c, err := g.gen(8)
			require.NoError(t, err)
			require.Equal(t, a, b, "same seed, different workloads")
			require.NotEqual(t, a, c, "different seeds, same workload")
			require.Len(t, a.Requests, 300)
			for i := 1; i < len(a.Requests); i++ {
				require.LessOrEqual(t, a.Requests[i-1].Arrival, a.Requests[i].Arrival, "request %d out of order", i)
			}
		})
	}
}

func TestMultiTurnPromptsExtendEarlierTurns(t *testing.T) {
	tests := []struct {
		name string
		wl   func() (*Workload, error)
	}{
		{"chat", func() (*Workload, error) { return Chat(ChatConfig{Requests: 200, Seed: 3}) }},
		{"agentic", func() (*Workload, error) { return Agentic(AgenticConfig{Requests: 200, Seed: 3}) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wl, err := tc.wl()
			require.NoError(t, err)
			last := map[string]*Request{}
			extended := 0
			for i := range wl.Requests {
				r := &wl.Requests[i]
				require.NotEmpty(t, r.Session)
				if prev, ok := last[r.Session]; ok {
					prefix := append(prev.Prompt.AppendTokens(nil), prev.Output.AppendTokens(nil)...)
					got := r.Prompt.AppendTokens(nil)
					require.Greater(t, len(got), len(prefix))
					require.Equal(t, prefix, got[:len(prefix)], "turn does not extend the previous prompt and answer")
					extended++
				}
				last[r.Session] = r
			}
			require.Positive(t, extended)
		})
	}
}

func TestSharedPrefixIdealHitRate(t *testing.T) {
	wl, err := SharedPrefix(SharedPrefixConfig{Requests: 2000, Seed: 1})
	require.NoError(t, err)
	st, err := wl.Stats(16)
	require.NoError(t, err)
	// System prompts of 2–6K tokens and suffixes of 32–256 tokens.
	require.InDelta(t, 0.94, st.IdealHitRate, 0.02)
	require.Equal(t, 2000, st.Requests)
}

func TestWorkloadConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
	}{
		{"negative requests", func() error { _, err := SharedPrefix(SharedPrefixConfig{Requests: -1}); return err }()},
		{"negative rate", func() error { _, err := Chat(ChatConfig{Rate: -1}); return err }()},
		{"empty range", func() error { _, err := Agentic(AgenticConfig{Steps: IntRange{5, 2}}); return err }()},
		{"bad speed", func() error { _, err := FromMooncake(nil, MooncakeConfig{Speed: -2}); return err }()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.err, ErrInvalidConfig)
		})
	}
}

func TestReadMooncake(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []TraceRecord
		wantErr string
	}{
		{
			name: "two records and a blank line",
			in: `{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}

{"timestamp": 27, "input_length": 512, "output_length": 0, "hash_ids": [1]}
`,
			want: []TraceRecord{
				{Timestamp: 0, InputLength: 600, OutputLength: 3, HashIDs: []int64{1, 2}},
				{Timestamp: 27, InputLength: 512, OutputLength: 0, HashIDs: []int64{1}},
			},
		},
		{name: "not json", in: "{\"timestamp\": 0,\n", wantErr: "line 1"},
		{name: "too few hash ids", in: `{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}`, wantErr: "want 3"},
		{name: "negative timestamp", in: `{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [1]}`, wantErr: "negative timestamp"},
		{name: "no input", in: `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`, wantErr: "input_length"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadMooncake(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrTrace)
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestMooncakeSample(t *testing.T) {
	recs, err := ReadMooncakeFile(filepath.Join("testdata", "mooncake_sample.jsonl"))
	require.NoError(t, err)
	require.Len(t, recs, 200)
	wl, err := FromMooncake(recs, MooncakeConfig{Speed: 4})
	require.NoError(t, err)
	require.Len(t, wl.Requests, 200)
	for i, r := range wl.Requests {
		require.Equal(t, recs[i].InputLength, r.Prompt.Len())
		require.Equal(t, time.Duration(recs[i].Timestamp)*time.Millisecond/4, r.Arrival)
	}
	// Equal hash ids give equal tokens, whatever request they are in.
	a := wl.Requests[0].Prompt[0].AppendTokens(nil)
	b := Segment{Seed: seedOf(kindTraceBlock, uint64(recs[0].HashIDs[0]), 0), Len: MooncakeBlockTokens}.AppendTokens(nil)
	require.Equal(t, a, b)
}

// fullTrace is the published Mooncake trace, read from the shared folder
// next to the repository.
const fullTrace = "../../shared/traces/mooncake_synthetic_trace.jsonl"

func TestMooncakeFullTrace(t *testing.T) {
	if _, err := os.Stat(fullTrace); err != nil {
		skipOrFail(t, "the full Mooncake trace "+fullTrace+" is missing")
	}
	recs, err := ReadMooncakeFile(fullTrace)
	require.NoError(t, err)
	require.Len(t, recs, 3993)
	wl, err := FromMooncake(recs, MooncakeConfig{})
	require.NoError(t, err)
	st, err := wl.Stats(16)
	require.NoError(t, err)
	// The trace's README gives 0.651 as the token-weighted ideal reuse.
	require.InDelta(t, 0.651, st.IdealHitRate, 0.01)
}

// skipOrFail skips the test because of what is missing, unless
// KVROUTE_EXTERNAL_TESTS=1 asks for every external dependency.
func skipOrFail(t *testing.T, missing string) {
	t.Helper()
	if os.Getenv("KVROUTE_EXTERNAL_TESTS") == "1" {
		t.Fatal(missing)
	}
	t.Skip(missing)
}
