package poll

import (
	"context"
	"time"
)

// The backoff starts short, because transfers of a few blocks finish in
// microseconds, and is capped so that a waiter notices completion within a
// millisecond without spinning a core.
const (
	minDelay = 10 * time.Microsecond
	maxDelay = time.Millisecond
	spins    = 16 // polls before the first sleep
)

// Until calls check until it reports done or fails, or ctx ends. Between
// calls it sleeps with exponential backoff from 10 µs to 1 ms. It returns
// check's error, or ctx's error wrapped by the caller's choice.
func Until(ctx context.Context, check func() (done bool, err error)) error {
	delay := minDelay
	var timer *time.Timer
	for i := 0; ; i++ {
		done, err := check()
		if err != nil || done {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if i < spins {
			continue
		}
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		delay = min(2*delay, maxDelay)
	}
}
