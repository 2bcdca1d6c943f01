package indexer

import (
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute"
)

// BenchmarkExtMapInsert stores new random engine hashes into 64 maps
// growing to 32K entries each, as 64 workers' maps do while an index
// fills.
func BenchmarkExtMapInsert(b *testing.B) {
	const maps, per = 64, 1 << 15
	r := rand.New(rand.NewPCG(1, 1))
	keys := make([]kvroute.ExternalHash, maps*per)
	for i := range keys {
		keys[i] = kvroute.ExternalHash(r.Uint64())
	}
	b.Run("extMap", func(b *testing.B) {
		for b.Loop() {
			ms := make([]extMap, maps)
			for i := range ms {
				ms[i] = newExtMap()
			}
			for i, k := range keys {
				m := &ms[i%maps]
				if _, ok := m.get(k); !ok {
					m.put(k, entry{id: 1, pos: 2, tiers: 1})
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(keys)), "ns/insert")
	})
	b.Run("builtin", func(b *testing.B) {
		for b.Loop() {
			ms := make([]map[kvroute.ExternalHash]uint64, maps)
			for i := range ms {
				ms[i] = map[kvroute.ExternalHash]uint64{}
			}
			for i, k := range keys {
				m := ms[i%maps]
				if _, ok := m[k]; !ok {
					m[k] = 7
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(keys)), "ns/insert")
	})
}
