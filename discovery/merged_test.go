package discovery_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/discovery"
)

// last is a Sink that keeps the engines' names of the last Sync.
type last struct{ names []string }

func (l *last) Sync(_ context.Context, engines []discovery.Engine) {
	l.names = l.names[:0]
	for _, e := range engines {
		l.names = append(l.names, e.Name+"@"+e.Host)
	}
}

// One source's Sync never removes another's engines; a name two sources
// give is the later source's engine.
func TestMerged(t *testing.T) {
	sink := &last{}
	m := discovery.NewMerged(sink, 2)
	ctx := context.Background()
	static, watched := m.Source(0), m.Source(1)
	static.Sync(ctx, []discovery.Engine{{Name: "a", Host: "s"}, {Name: "b", Host: "s"}})
	require.Equal(t, []string{"a@s", "b@s"}, sink.names)
	watched.Sync(ctx, []discovery.Engine{{Name: "c", Host: "w"}, {Name: "b", Host: "w"}})
	require.Equal(t, []string{"a@s", "b@w", "c@w"}, sink.names)
	watched.Sync(ctx, nil)
	require.Equal(t, []string{"a@s", "b@s"}, sink.names)
	static.Sync(ctx, nil)
	require.Empty(t, sink.names)
	require.Panics(t, func() { m.Source(2) })
}
