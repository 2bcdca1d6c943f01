package bench

import (
	"time"

	"github.com/kvroute/kvroute/scheduling"
)

// eventKind is what a scheduled simulation event does.
type eventKind uint8

const (
	evStepDone  eventKind = iota + 1 // an engine step ends
	evKVEvents                       // an engine's KV event batch reaches the router
	evHeartbeat                      // an engine's load report reaches the router
	evTick                           // engines sample their load; the router checks health
	evLoadStale                      // an engine's load report stops counting (Policy.FreshLoad)
)

// simEvent is one scheduled event of the discrete-event loop.
type simEvent struct {
	at      time.Duration
	seq     uint64 // insertion order: ties at equal times run first in, first out
	kind    eventKind
	engine  int
	payload []byte
	load    scheduling.Load
	gen     uint64 // evLoadStale: the engine's report it ends
}

func (a *simEvent) before(b *simEvent) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

// eventHeap is a binary min-heap of events by (at, seq). It stores values,
// not pointers, so that scheduling an event allocates nothing once the heap
// has grown.
type eventHeap struct {
	items []simEvent
	seq   uint64
}

func (h *eventHeap) len() int { return len(h.items) }

func (h *eventHeap) push(ev simEvent) {
	h.seq++
	ev.seq = h.seq
	h.items = append(h.items, ev)
	i := len(h.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.items[i].before(&h.items[p]) {
			break
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

// peek returns the earliest event; the heap must not be empty.
func (h *eventHeap) peek() *simEvent { return &h.items[0] }

func (h *eventHeap) pop() simEvent {
	top := h.items[0]
	n := len(h.items) - 1
	h.items[0] = h.items[n]
	h.items[n] = simEvent{}
	h.items = h.items[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h.items[r].before(&h.items[l]) {
			m = r
		}
		if !h.items[m].before(&h.items[i]) {
			break
		}
		h.items[i], h.items[m] = h.items[m], h.items[i]
		i = m
	}
	return top
}
