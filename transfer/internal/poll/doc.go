// Package poll waits for a condition that can only be polled, with
// exponential backoff.
//
// # Usage
//
// Backends whose native library only offers a status call (NIXL's
// getXferStatus) wait for it with Until:
//
//	err := poll.Until(ctx, func() (bool, error) {
//		st, err := req.Status()
//		return st == transfer.StatusDone, err
//	})
package poll
