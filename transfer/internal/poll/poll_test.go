package poll

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestUntil(t *testing.T) {
	boom := errors.New("boom")
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		doneAt  int
		failAt  int
		want    error
		wantRun int
	}{
		{name: "done at once", ctx: context.Background(), doneAt: 1, wantRun: 1},
		{name: "done after sleeps", ctx: context.Background(), doneAt: 40, wantRun: 40},
		{name: "error", ctx: context.Background(), failAt: 3, want: boom, wantRun: 3},
		{name: "canceled", ctx: canceled, want: context.Canceled, wantRun: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runs := 0
			err := Until(tc.ctx, func() (bool, error) {
				runs++
				if runs == tc.failAt {
					return false, boom
				}
				return runs == tc.doneAt, nil
			})
			require.ErrorIs(t, err, tc.want)
			if tc.want == nil {
				require.NoError(t, err)
			}
			require.Equal(t, tc.wantRun, runs)
		})
	}
}
