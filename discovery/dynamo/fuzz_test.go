package dynamo_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/discovery/dynamo"
)

// FuzzDecode feeds store values, seeded with the captured ones: Decode
// never panics, and what it accepts joins into a deployment without
// panicking either.
func FuzzDecode(f *testing.F) {
	for _, shape := range goldenShapes {
		for _, b := range dynamo.Buckets {
			dir := filepath.Join("testdata", shape.dir, filepath.FromSlash(b))
			ents, err := os.ReadDir(dir)
			require.NoError(f, err)
			for _, e := range ents {
				v, err := os.ReadFile(filepath.Join(dir, e.Name()))
				require.NoError(f, err)
				f.Add(v)
				if shape.dir == "filestore-dp2" {
					// As the second node of a multi-node data-parallel
					// deployment records it: ranks 2 and 3.
					e := strings.NewReplacer(`"data_parallel_start_rank":0`, `"data_parallel_start_rank":2`,
						`"dp_rank":0}`, `"dp_rank":2}`, `"dp_rank":1}`, `"dp_rank":3}`).Replace(string(v))
					if e != string(v) {
						f.Add([]byte(e))
					}
				}
			}
		}
	}
	f.Add([]byte(`{"type":"EventChannel","scope":{"kind":"component","namespace":"n","component":"c"},"topic":"kv-events","instance_id":1,"transport":{"kind":"ZmqBroker","config":{"xpub_endpoints":["tcp://a:2"]}}}`))
	f.Fuzz(func(t *testing.T, value []byte) {
		rec, err := dynamo.Decode(value)
		if err != nil {
			require.ErrorIs(t, err, dynamo.ErrValue)
			return
		}
		n := 0
		for _, set := range []bool{rec.Instance != nil, rec.Model != nil, rec.Channel != nil, rec.Source != nil} {
			if set {
				n++
			}
		}
		require.Equal(t, 1, n, "exactly one record kind")
		// Joined with the captured worker, under every bucket.
		st := goldenState(t, "file")
		for _, b := range dynamo.Buckets {
			require.NoError(t, st.Put(b+"/fuzz/1", value, 7))
		}
		d := st.Deployment(dynamo.Selector{})
		for _, w := range d.Workers {
			require.GreaterOrEqual(t, w.DPSize, 1)
			require.Positive(t, w.BlockSize)
			e := w.Engine()
			for _, p := range e.DynamoEvents {
				require.True(t, p.Rank >= 0 && p.Rank < e.Ranks, "rank %d of %d", p.Rank, e.Ranks)
			}
		}
	})
}

// FuzzFileKey feeds file names: FileKey never panics and accepts exactly
// the names that are valid escapes of a key.
func FuzzFileKey(f *testing.F) {
	for _, b := range dynamo.Buckets {
		ents, err := os.ReadDir(filepath.Join("testdata", "filestore", filepath.FromSlash(b)))
		require.NoError(f, err)
		for _, e := range ents {
			f.Add(e.Name())
		}
	}
	f.Add("a%2")
	f.Fuzz(func(t *testing.T, name string) {
		key, err := dynamo.FileKey(dynamo.BucketInstances, name)
		if err != nil {
			require.ErrorIs(t, err, dynamo.ErrValue)
			return
		}
		require.Greater(t, len(key), len(dynamo.BucketInstances)+1)
		// Escaped again as Dynamo names files, it reads back the same.
		again, err := dynamo.FileKey(dynamo.BucketInstances, escapeKey(strings.TrimPrefix(key, dynamo.BucketInstances+"/")))
		require.NoError(t, err)
		require.Equal(t, key, again)
	})
}

// escapeKey names a file as Dynamo's file store does: every byte but
// ASCII letters and digits as %XX.
func escapeKey(k string) string {
	var b strings.Builder
	for i := range len(k) {
		c := k[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
