package main

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/bench"
)

// smallTree is a quick tree workload with every section non-empty.
func smallTree() treeConfig {
	c := defaultTree().scaled(0.01)
	c.Workers, c.HotRepeat, c.ColdRepeat, c.PartialRepeat = 16, 2, 2, 2
	return c
}

// sampleRecords returns the first n records of bench's Mooncake sample.
func sampleRecords(t testing.TB, n int) []bench.TraceRecord {
	t.Helper()
	recs, err := bench.ReadMooncakeFile("../../testdata/mooncake_sample.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	return recs[:min(n, len(recs))]
}

// smallTrace is a quick replay: 4 blocks per hash id and caches small
// enough that every worker evicts.
func smallTrace(e eviction) traceConfig {
	c := defaultTrace(e)
	c.BlocksPerID, c.Capacity = 4, 700
	return c
}

func encode(t testing.TB, w *workload) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := encodeWorkload(&b, w); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func testWorkloads(t testing.TB) map[string]*workload {
	t.Helper()
	out := map[string]*workload{"tree": genTree(smallTree()), "hash": genHash(hashConfig{Prompts: 4, Tokens: 4096, Repeat: 2, Seed: 1})}
	for name, e := range map[string]eviction{"trace-lru": evictLRU, "trace-random": evictRandom} {
		w, err := genTrace(sampleRecords(t, 80), smallTrace(e))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = w
	}
	return out
}

func TestWorkloadRoundTrip(t *testing.T) {
	for name, w := range testWorkloads(t) {
		t.Run(name, func(t *testing.T) {
			b := encode(t, w)
			got, err := decodeWorkload(b)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(encode(t, got), b) {
				t.Fatal("decoding and encoding again changes the file")
			}
			if !slices.EqualFunc(expectedDigests(got), expectedDigests(w), slices.Equal) {
				t.Fatal("expected digests differ after the round trip")
			}
		})
	}
}

func TestDecodeRejectsDamage(t *testing.T) {
	b := encode(t, genHash(hashConfig{Prompts: 2, Tokens: 64, Repeat: 3, Seed: 1}))
	tests := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"bad magic", append([]byte("KVPEER99"), b[8:]...)},
		{"truncated", b[:len(b)-3]},
		{"trailing", append(slices.Clone(b), 0)},
		{"unknown kind", func() []byte {
			c := slices.Clone(b)
			// The first operation's kind follows the header, the section
			// name ("hash"), flags, metric, repeat and count.
			c[8+4+4+2+4+1+1+4+8] = 9
			return c
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := decodeWorkload(tt.data); !errors.Is(err, errFormat) {
				t.Fatalf("err = %v, want errFormat", err)
			}
		})
	}
}

func TestEncodeRejectsRepeatedEvents(t *testing.T) {
	m := newModel(2, 0)
	path := chainBlocks(nil, 0, false, []kvroute.BlockHash{1, 2})
	w := &workload{BlockSize: 16, Sections: []section{{Name: "x", Repeat: 2, Ops: []op{m.store(0, 0, path)}}}}
	if err := encodeWorkload(&bytes.Buffer{}, w); !errors.Is(err, errFormat) {
		t.Fatalf("err = %v, want errFormat", err)
	}
}

func TestModelOverlaps(t *testing.T) {
	path := chainBlocks(nil, 0, false, []kvroute.BlockHash{10, 11, 12, 13, 14, 15})
	type step struct {
		store  bool
		worker int
		from   int // store: from; remove: the index of the block
		to     int // store: end of the stored prefix
	}
	tests := []struct {
		name  string
		steps []step
		query int // query path[:query]
		want  []score
	}{
		{"empty", nil, 6, nil},
		{"one worker whole path", []step{{true, 0, 0, 6}}, 6, []score{{1, 6}}},
		{"different depths", []step{{true, 0, 0, 6}, {true, 2, 0, 2}, {true, 1, 0, 4}}, 6, []score{{1, 6}, {2, 4}, {3, 2}}},
		{"query shorter than holdings", []step{{true, 0, 0, 6}, {true, 1, 0, 2}}, 3, []score{{1, 3}, {2, 2}}},
		{"mid-chain removal cuts the overlap", []step{{true, 0, 0, 6}, {false, 0, 3, 0}}, 6, []score{{1, 3}}},
		{"removing the first block leaves nothing", []step{{true, 0, 0, 6}, {false, 0, 0, 0}}, 6, nil},
		{"restoring the hole restores the rest", []step{{true, 0, 0, 6}, {false, 0, 3, 0}, {true, 0, 3, 4}}, 6, []score{{1, 6}}},
		{"tail removal", []step{{true, 0, 0, 6}, {false, 0, 5, 0}, {false, 0, 4, 0}}, 6, []score{{1, 4}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newModel(3, 0)
			for _, s := range tt.steps {
				if s.store {
					m.store(s.worker, s.from, path[:s.to])
				} else {
					m.remove(s.worker, path[s.from:s.from+1])
				}
			}
			if got := m.overlaps(path[:tt.query]); !slices.Equal(got, tt.want) {
				t.Fatalf("overlaps = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestModelEvents(t *testing.T) {
	m := newModel(2, 0)
	path := chainBlocks(nil, 0, false, []kvroute.BlockHash{1, 2, 3})
	s1 := m.store(1, 0, path[:2])
	s2 := m.store(1, 2, path)
	r := m.remove(1, []chainBlock{path[2], path[1]})
	if s1.EventID != 1 || s2.EventID != 2 || r.EventID != 3 || s1.Worker != 2 {
		t.Fatalf("ids %d %d %d worker %d, want 1 2 3 on worker 2", s1.EventID, s2.EventID, r.EventID, s1.Worker)
	}
	if s1.HasParent || !s2.HasParent || s2.Parent != path[1].Ext || len(s2.Blocks) != 1 || s2.Blocks[0].Local != 3 {
		t.Fatalf("stored events %+v %+v", s1, s2)
	}
	if !slices.Equal(r.Removed, []kvroute.ExternalHash{path[2].Ext, path[1].Ext}) || m.count[1] != 1 {
		t.Fatalf("removed %v, count %d", r.Removed, m.count[1])
	}
	// Sequence hashes chain as kvroute's hasher does.
	if want := kvroute.NextSeqHash(kvroute.SeqHash(1), 2); path[1].Seq != want || path[0].Seq != 1 {
		t.Fatalf("sequence hashes %v", path)
	}
}

// TestTraceEvictions replays the events of both replays on plain maps and
// checks parents, cache limits and the shape of evictions.
func TestTraceEvictions(t *testing.T) {
	for _, e := range []eviction{evictLRU, evictRandom} {
		c := smallTrace(e)
		w, err := genTrace(sampleRecords(t, 80), c)
		if err != nil {
			t.Fatal(err)
		}
		held := make([]map[kvroute.ExternalHash]kvroute.ExternalHash, c.Workers) // block → parent (0 at the root)
		for i := range held {
			held[i] = map[kvroute.ExternalHash]kvroute.ExternalHash{}
		}
		var removed, midChain, queries int
		for _, o := range w.Sections[0].Ops {
			switch o.Kind {
			case opQuery:
				queries++
			case opStored:
				h := held[o.Worker-1]
				parent := o.Parent
				if o.HasParent {
					if _, ok := h[parent]; !ok {
						t.Fatalf("eviction %d: stored event with a parent the worker does not hold", e)
					}
				}
				for _, b := range o.Blocks {
					h[b.Ext] = parent
					parent = b.Ext
				}
				if len(h) > c.Capacity {
					t.Fatalf("eviction %d: worker %d holds %d blocks, capacity %d", e, o.Worker, len(h), c.Capacity)
				}
			case opRemoved:
				h := held[o.Worker-1]
				for _, x := range o.Removed {
					if _, ok := h[x]; !ok {
						t.Fatalf("eviction %d: removes a block the worker does not hold", e)
					}
					delete(h, x)
					removed++
					for _, p := range h {
						if p == x {
							midChain++ // a child is still held
							break
						}
					}
				}
			}
		}
		switch {
		case queries != 79 && queries != 80:
			t.Errorf("eviction %d: %d queries for 80 records", e, queries)
		case removed == 0:
			t.Errorf("eviction %d: nothing evicted", e)
		case e == evictLRU && midChain != 0:
			t.Errorf("LRU evicted %d blocks whose child stays held, want tail first", midChain)
		case e == evictRandom && midChain == 0:
			t.Errorf("random eviction never removed a mid-chain block")
		}
	}
}

func TestTraceBlocks(t *testing.T) {
	rec := bench.TraceRecord{InputLength: 1000, OutputLength: 1, HashIDs: []int64{7, 8}}
	got := traceBlocks(&rec, 32)
	if len(got) != 1000/16 {
		t.Fatalf("%d blocks, want %d", len(got), 1000/16)
	}
	other := bench.TraceRecord{InputLength: 600, OutputLength: 1, HashIDs: []int64{7, 9}}
	o := traceBlocks(&other, 32)
	for i := range 32 {
		if o[i] != got[i] {
			t.Fatalf("block %d differs for equal hash ids", i)
		}
	}
	if o[32] == got[32] {
		t.Fatal("different hash ids give equal blocks")
	}
}

// TestKvrouteMatchesGroundTruth runs kvroute's index over small versions of
// every workload: each answer must equal the ground truth, and every event
// must apply.
func TestKvrouteMatchesGroundTruth(t *testing.T) {
	for name, w := range testWorkloads(t) {
		t.Run(name, func(t *testing.T) {
			res, err := runKV(w, 0, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			want := expectedDigests(w)
			answers := 0
			for i, r := range res.Sections {
				answers += len(want[i])
				if n := mismatches(want[i], r.Digests); n != 0 {
					t.Errorf("%s: %d of %d answers differ from the ground truth", r.Name, n, len(want[i]))
				}
				if r.Errors != 0 {
					t.Errorf("%s: %d events rejected, first: %s", r.Name, r.Errors, r.FirstErr)
				}
				if r.Timed && (r.Ops == 0 || r.BlockOps == 0) {
					t.Errorf("%s: nothing counted", r.Name)
				}
			}
			if answers == 0 {
				t.Fatal("no answers checked")
			}
		})
	}
}

func TestMismatches(t *testing.T) {
	if n := mismatches([]uint64{1, 2, 3}, []uint64{1, 5}); n != 2 {
		t.Errorf("mismatches = %d, want 2", n)
	}
}

func FuzzDecodeWorkload(f *testing.F) {
	f.Add(encode(f, genHash(hashConfig{Prompts: 1, Tokens: 32, Repeat: 2, Seed: 1})))
	c := smallTree()
	c.Chains, c.ChainLen, c.QueryLen, c.ApplyChains = 3, 4, 4, 2
	c.HotQueries, c.ColdQueries, c.PartialQueries, c.CheckQueries = 1, 1, 1, 1
	f.Add(encode(f, genTree(c)))
	f.Add([]byte(workloadMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := decodeWorkload(b)
		if err != nil {
			if !errors.Is(err, errFormat) {
				t.Fatalf("error %v does not wrap errFormat", err)
			}
			return
		}
		if !bytes.Equal(encode(t, w), b) {
			t.Fatal("a decoded file encodes differently")
		}
	})
}

func TestTraceWarmSplitsTheSameReplay(t *testing.T) {
	for _, e := range []eviction{evictLRU, evictRandom} {
		c := smallTrace(e)
		cold, err := genTrace(sampleRecords(t, 80), c)
		if err != nil {
			t.Fatal(err)
		}
		c.Warm = warmShare
		warm, err := genTrace(sampleRecords(t, 80), c)
		if err != nil {
			t.Fatal(err)
		}
		if len(warm.Sections) != 2 {
			t.Fatalf("eviction %d: %d sections, want warm and steady", e, len(warm.Sections))
		}
		w, s := warm.Sections[0], warm.Sections[1]
		if w.Name != secWarm || w.Timed || s.Name != secSteady || !s.Timed {
			t.Fatalf("eviction %d: sections %q (timed %v) and %q (timed %v)", e, w.Name, w.Timed, s.Name, s.Timed)
		}
		queries := 0
		for _, o := range w.Ops {
			if o.Kind == opQuery {
				queries++
			}
		}
		if queries != 40 {
			t.Errorf("eviction %d: the warm section has %d requests, want 40 of 80", e, queries)
		}
		// The same operations, split where the 41st request begins.
		if s.Ops[0].Kind != opQuery {
			t.Errorf("eviction %d: the steady section starts with a %v, not a query", e, s.Ops[0].Kind)
		}
		if !reflect.DeepEqual(append(slices.Clone(w.Ops), s.Ops...), cold.Sections[0].Ops) {
			t.Errorf("eviction %d: warm and steady together are not the cold replay", e)
		}
	}
}

// Passes on new indexes answer alike and add up, and so does an index
// with room reserved for the workers' caches.
func TestKvroutePasses(t *testing.T) {
	for name, w := range testWorkloads(t) {
		t.Run(name, func(t *testing.T) {
			one, err := runKV(w, 0, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			three, err := runKV(w, 0, 3, 0)
			if err != nil {
				t.Fatal(err)
			}
			reserved, err := runKV(w, 0, 2, 64)
			if err != nil {
				t.Fatal(err)
			}
			for i := range one.Sections {
				a, b := &one.Sections[i], &three.Sections[i]
				if !slices.Equal(a.Digests, b.Digests) {
					t.Errorf("%s: three passes answer differently from one", a.Name)
				}
				if r := &reserved.Sections[i]; !slices.Equal(a.Digests, r.Digests) || r.Errors != a.Errors {
					t.Errorf("%s: an index with room reserved answers differently", a.Name)
				}
				if b.Ops != 3*a.Ops || b.BlockOps != 3*a.BlockOps || b.Errors != a.Errors {
					t.Errorf("%s: three passes count %d ops, %d block-ops, %d errors; one pass %d, %d, %d",
						a.Name, b.Ops, b.BlockOps, b.Errors, a.Ops, a.BlockOps, a.Errors)
				}
			}
		})
	}
}

// TestKvrouteCountsRejectedStoredBlocks checks that the kvroute side counts
// the blocks of the Stored events its index rejects, and only those: a
// Stored event repeated with its event ID, and a Removed event of a block
// the worker never stored, which the index counts but does not reject.
func TestKvrouteCountsRejectedStoredBlocks(t *testing.T) {
	stored := op{Kind: opStored, Worker: 1, EventID: 1, Blocks: []block{{Local: 11, Ext: 101}, {Local: 12, Ext: 102}, {Local: 13, Ext: 103}}}
	w := &workload{BlockSize: 16, Sections: []section{{Name: "events", Timed: true, Ops: []op{
		stored,
		stored, // the same event ID again
		{Kind: opRemoved, Worker: 1, EventID: 2, Removed: []kvroute.ExternalHash{999}},
	}}}}
	res, err := runKV(w, 0, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := res.Sections[0]
	if r.Errors != 1 || r.RejectedStoredBlocks != 3 {
		t.Fatalf("errors %d, rejected stored blocks %d; want 1 and 3 (first error: %s)", r.Errors, r.RejectedStoredBlocks, r.FirstErr)
	}
}
