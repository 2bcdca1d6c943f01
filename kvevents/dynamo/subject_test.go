package dynamo_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/kvevents/dynamo"
)

func TestSubject(t *testing.T) {
	for _, tc := range []struct {
		ns, comp, ep, topic, want string
	}{
		{"dynamo", "backend", "generate", "kv-events", "namespace.dynamo.component.backend.endpoint.generate.kv-events"},
		{"dynamo", "backend", "generate", "kv_metrics", "namespace.dynamo.component.backend.endpoint.generate.kv_metrics"},
		{"my.ns", "back end", "gen*", "kv-events", "namespace.my%2Ens.component.back%20end.endpoint.gen%2A.kv-events"},
		{"", "", "", "", "namespace..component..endpoint.."},
	} {
		require.Equal(t, tc.want, dynamo.Subject(tc.ns, tc.comp, tc.ep, tc.topic))
	}
}
