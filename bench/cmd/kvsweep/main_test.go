package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSweep(t *testing.T) {
	var out, errs bytes.Buffer
	err := run([]string{"-workload", "e", "-seeds", "2", "-requests", "60", "-overlap", "1,2", "-prefill-scale", "16",
		"-active", "16", "-kv", "8000", "-bound", "none,kv:2"}, &out, &errs)
	require.NoError(t, err, errs.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	// The header, the two defaults and 2 × 2 configurations.
	require.Len(t, lines, 7, out.String())
	require.Contains(t, out.String(), "overlap 2, prefill scale 16, active 16, kv 8000, bound kv:2")
	for _, l := range lines {
		if strings.Contains(l, "Dynamo's default cost") {
			// Every ratio of the reference to itself is 1.
			require.Equal(t, []string{"1.000", "1.000", "1.000", "1.000", "1.000", "1.000", "1.000", "1.000"}, strings.Fields(l)[3:], l)
		}
	}
	require.Contains(t, errs.String(), "seed 2 of 2 done")
}

func TestSweepMinThroughputKeepsTheDefaults(t *testing.T) {
	var out, errs bytes.Buffer
	err := run([]string{"-workload", "e", "-seeds", "1", "-requests", "40", "-overlap", "2", "-prefill-scale", "16",
		"-active", "16", "-kv", "0", "-bound", "none", "-min-throughput", "10"}, &out, &errs)
	require.NoError(t, err, errs.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3, "the header and the two defaults:\n%s", out.String())
}

func TestSweepRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bound kind", []string{"-bound", "blocks:2"}, "bound"},
		{"bound below 1", []string{"-bound", "kv:0.5"}, "bound"},
		{"negative weight", []string{"-kv", "-1"}, "-kv"},
		{"not a number", []string{"-overlap", "two"}, "-overlap"},
		{"no seeds", []string{"-seeds", "0"}, "-seeds"},
		{"unknown scenario", []string{"-workload", "z", "-seeds", "1", "-overlap", "1", "-prefill-scale", "1", "-active", "0", "-kv", "0", "-bound", "none"}, "unknown scenario"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errs bytes.Buffer
			err := run(tc.args, &out, &errs)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
