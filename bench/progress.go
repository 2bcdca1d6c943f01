package bench

import (
	"fmt"
	"io"
)

// ProgressPrinter returns a Config.Progress function that keeps one status
// line on w (a terminal's stderr), "label: 42%", rewritten in place, and
// ends it with a newline at 100%.
func ProgressPrinter(w io.Writer, label string) func(done, total int) {
	last := -1
	return func(done, total int) {
		if total <= 0 {
			return
		}
		p := 100 * done / total
		if p == last {
			return
		}
		last = p
		fmt.Fprintf(w, "\r%s: %3d%%", label, p)
		if done >= total {
			fmt.Fprintln(w)
		}
	}
}
