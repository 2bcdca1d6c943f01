package gateway_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/examples/gateway/gateway"
)

func TestParseEngine(t *testing.T) {
	tests := []struct {
		spec    string
		want    gateway.Engine
		wantErr string
	}{
		{spec: "1=http://127.0.0.1:8000", want: gateway.Engine{ID: 1, URL: "http://127.0.0.1:8000"}},
		{spec: "7=http://h:8000,zmq=tcp://h:5557,replay=tcp://h:5558,topic=kv-events,ranks=2,max-requests=256,max-batched-tokens=8192,kv-blocks=1000",
			want: gateway.Engine{ID: 7, URL: "http://h:8000", Events: "tcp://h:5557", Replay: "tcp://h:5558", Topic: "kv-events",
				Ranks: 2, MaxRequests: 256, MaxBatchedTokens: 8192, KVCapacityBlocks: 1000}},
		{spec: "2=https://h,events=tcp://h:1", want: gateway.Engine{ID: 2, URL: "https://h", Events: "tcp://h:1"}},
		{spec: "http://h:8000", wantErr: "id"},
		{spec: "x=http://h:8000", wantErr: "id"},
		{spec: "1", wantErr: "ID=URL"},
		{spec: "1=h:8000", wantErr: "not http(s)"},
		{spec: "1=http://h,color=red", wantErr: "unknown option"},
		{spec: "1=http://h,ranks", wantErr: "not key=value"},
		{spec: "1=http://h,ranks=two", wantErr: "ranks"},
		{spec: "1=http://h,ranks=-1", wantErr: "negative"},
		{spec: "1=http://h,replay=tcp://h:2", wantErr: "without an events endpoint"},
		{spec: "1=http://h,events=ipc:///tmp/kv,ranks=2", wantErr: "no port to offset"},
		{spec: "1=http://h,events=tcp://h:65535,ranks=2", wantErr: "no port to offset"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := gateway.ParseEngine(tt.spec)
			if tt.wantErr != "" {
				require.ErrorIs(t, err, gateway.ErrEngineConfig)
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}
