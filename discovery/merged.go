package discovery

import (
	"context"
	"fmt"
	"sync"
)

// Merged combines the engines of several sources, such as a static list
// and a watcher, into one Sink: each source syncs its own part (Source),
// and the sink gets the union of the parts at every change, so that one
// source's Sync never removes another's engines. An engine that two
// sources name is the one of the later source. It is safe for concurrent
// use by the sources.
type Merged struct {
	sink  Sink
	mu    sync.Mutex
	parts [][]Engine
}

// NewMerged returns a Merged of n sources syncing sink.
func NewMerged(sink Sink, n int) *Merged {
	return &Merged{sink: sink, parts: make([][]Engine, n)}
}

// Source returns the Sink of source i, from 0 to n-1.
func (m *Merged) Source(i int) Sink {
	if i < 0 || i >= len(m.parts) {
		panic(fmt.Sprintf("discovery: source %d of a Merged of %d", i, len(m.parts)))
	}
	return mergedSource{m: m, i: i}
}

type mergedSource struct {
	m *Merged
	i int
}

// Sync replaces the source's part and syncs the union.
func (s mergedSource) Sync(ctx context.Context, engines []Engine) {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	m.parts[s.i] = make([]Engine, len(engines))
	for i := range engines {
		m.parts[s.i][i] = engines[i].clone()
	}
	var all []Engine
	seen := map[string]int{}
	for _, part := range m.parts {
		for _, e := range part {
			if j, ok := seen[e.Name]; ok {
				all[j] = e
				continue
			}
			seen[e.Name] = len(all)
			all = append(all, e)
		}
	}
	m.sink.Sync(ctx, all)
}
