package stats

import (
	"slices"
	"testing"
)

func TestMedian(t *testing.T) {
	tests := []struct {
		name string
		xs   []float64
		want float64
	}{
		{"none", nil, 0},
		{"one", []float64{3}, 3},
		{"odd count, unsorted", []float64{5, 1, 3}, 3},
		{"even count: the mean of the middle two", []float64{4, 1, 3, 2}, 2.5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.xs)
			if got := Median(tc.xs); got != tc.want {
				t.Fatalf("Median(%v) = %v, want %v", tc.xs, got, tc.want)
			}
			if !slices.Equal(in, tc.xs) {
				t.Fatalf("Median reordered its input: %v, was %v", tc.xs, in)
			}
		})
	}
}
