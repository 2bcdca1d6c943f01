package stats_test

import (
	"fmt"

	"github.com/kvroute/kvroute/internal/stats"
)

func ExampleMedian() {
	fmt.Println(stats.Median([]float64{0.74, 0.71, 0.80}), stats.Median([]float64{1, 2, 3, 4}))
	// Output: 0.74 2.5
}
