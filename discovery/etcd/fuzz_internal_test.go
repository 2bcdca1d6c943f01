package etcd

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/discovery"
)

// seedEngines are descriptions as Register writes them.
var seedEngines = []discovery.Engine{
	{Name: "vllm-0", Host: "10.0.0.7", Ports: []int{8000, 8001}, Ready: true, Events: "tcp://10.0.0.7:5557",
		Replay: "tcp://10.0.0.7:5558", Topic: "kv", Metrics: "http://10.0.0.7:8000/metrics", Kind: "vllm", BlockSize: 16,
		KVBlocks: 27910, MaxRequests: 256, MaxBatchedTokens: 8192, Role: "prefill"},
	{Name: "b", ID: 6102808441099218236, Ranks: 2, Ready: true, DynamoEvents: []discovery.DynamoPublisher{
		{Endpoint: "tcp://127.0.0.1:40321", Rank: 1, Recovery: "127.0.0.1:37047/x/dynamo/backend/generate"}}},
	{Name: "c/d", Host: "h", Ports: []int{1}},
}

// FuzzWatchValues: any sequence of puts (of any value) and deletes under
// the prefix gives a set of valid engines with distinct names; a refused
// value says why (wrapping discovery.ErrEngine) and changes nothing; an
// accepted one is what Decode gives, and its JSON encoding decodes to the
// same description.
func FuzzWatchValues(f *testing.F) {
	var valid [][]byte
	for _, e := range seedEngines {
		b, err := json.Marshal(e)
		require.NoError(f, err)
		valid = append(valid, b)
	}
	bad := []string{`{`, `null`, `{"host":"h","ports":[]}`, `{"host":"h","ports":[70000]}`, `{"ports":[1]}`,
		`{"host":"h","ports":[1,2],"events":"tcp://h"}`, `{"host":"h","ports":[1],"kind":"tgi"}`, `{"name":"vllm-0","host":"h","ports":[1]}`,
		`{"ranks":5000}`, `{"host":"h","ports":[1]} x`, `{"host":"h","ports":[1],"role":"both"}`}
	for i, v := range append(slices.Clone(valid), stringsToBytes(bad)...) {
		f.Add([]byte{0, 5, 1, 9, 2, 4, byte(i), 13, 3, 0}, v, valid[i%len(valid)])
	}
	const prefix = "/kvroute/pool/"
	keys := []string{prefix + "vllm-0", prefix + "b", prefix + "c/d", prefix + "e"}
	f.Fuzz(func(t *testing.T, ops, v1, v2 []byte) {
		values := append(slices.Clone(valid), v1, v2)
		set := newEngineSet(prefix)
		for _, op := range ops {
			key := keys[op&3]
			before, beforeKeys, waiting := set.engines(), maps.Clone(set.byKey), maps.Clone(set.waiting)
			// Other keys keep their engines, but for one that waited for a
			// name the operation freed, which takes it.
			othersKept := func() {
				t.Helper()
				for k, e := range set.byKey {
					if k == key {
						continue
					}
					if old, ok := beforeKeys[k]; !ok || !reflect.DeepEqual(old, e) {
						require.Equal(t, waiting[k], e, "key %s's engine changed", k)
					}
				}
			}
			if op&4 != 0 {
				set.delete(key)
				_, had := set.byKey[key]
				require.False(t, had)
				othersKept()
				continue
			}
			value := values[int(op>>3)%len(values)]
			name := strings.TrimPrefix(key, prefix)
			want, derr := Decode(name, value)
			err := set.put(key, value)
			if err != nil {
				require.ErrorIs(t, err, discovery.ErrEngine)
				require.NotEmpty(t, strings.TrimPrefix(err.Error(), discovery.ErrEngine.Error()))
				require.Equal(t, before, set.engines(), "a refused value changed the engines")
				if derr == nil {
					require.ErrorContains(t, err, "the name is key", "Decode accepted it: only a name clash refuses it")
				}
				continue
			}
			require.NoError(t, derr)
			require.Equal(t, want, set.byKey[key])
			othersKept()
			again, err := json.Marshal(want)
			require.NoError(t, err)
			e2, err := Decode(name, again)
			require.NoError(t, err, "re-encoded: %s", again)
			again2, _ := json.Marshal(e2)
			require.Equal(t, string(again), string(again2))
		}
		names := map[string]bool{}
		for _, e := range set.engines() {
			require.NoError(t, e.Validate())
			require.False(t, names[e.Name], "two keys describe %s", e.Name)
			names[e.Name] = true
		}
		require.Len(t, set.names, len(set.byKey))
	})
}

func stringsToBytes(s []string) [][]byte {
	out := make([][]byte, len(s))
	for i := range s {
		out[i] = []byte(s[i])
	}
	return out
}

func TestEngineSetKeepsLastValid(t *testing.T) {
	set := newEngineSet("/p/")
	good, _ := json.Marshal(seedEngines[2])
	require.NoError(t, set.put("/p/c/d", good))
	err := set.put("/p/c/d", []byte(`{"host":"h","ports":[0]}`))
	require.ErrorIs(t, err, discovery.ErrEngine)
	require.ErrorContains(t, err, "port 0 out of range (keeping the last valid description of c/d)")
	require.Equal(t, []discovery.Engine{seedEngines[2]}, set.engines())
	// Another key claiming the name is refused; the first keeps it.
	err = set.put("/p/x", []byte(`{"name":"c/d","host":"h2","ports":[2]}`))
	require.ErrorContains(t, err, `c/d: the name is key "/p/c/d"'s already`)
	require.Equal(t, []discovery.Engine{seedEngines[2]}, set.engines())
	// When the first key goes, the waiting one takes the name at once.
	set.delete("/p/c/d")
	require.Len(t, set.engines(), 1)
	require.Equal(t, "h2", set.engines()[0].Host)
	require.Equal(t, fmt.Sprint(map[string]string{"c/d": "/p/x"}), fmt.Sprint(set.names))
	require.NoError(t, set.put("/p/x", []byte(`{"name":"c/d","host":"h3","ports":[2]}`)))
	require.Equal(t, "h3", set.engines()[0].Host)
	// A key waiting keeps its own engine meanwhile; renamed by its owner,
	// a name frees and passes on.
	require.NoError(t, set.put("/p/y", []byte(`{"name":"f","host":"h4","ports":[2]}`)))
	require.Error(t, set.put("/p/y", []byte(`{"name":"c/d","host":"h4","ports":[2]}`)))
	require.Error(t, set.put("/p/z", []byte(`{"name":"c/d","host":"h5","ports":[2]}`)))
	require.Equal(t, "f", set.byKey["/p/y"].Name)
	require.NoError(t, set.put("/p/x", []byte(`{"name":"g","host":"h3","ports":[2]}`)))
	require.Equal(t, "c/d", set.byKey["/p/y"].Name, "the first waiting key by key order")
	require.Equal(t, fmt.Sprint(map[string]string{"c/d": "/p/y", "g": "/p/x"}), fmt.Sprint(set.names))
	// A waiting key deleted waits no more.
	set.delete("/p/z")
	require.Empty(t, set.waiting)
}
