package indexer_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute/indexer"
)

// A worker removed while Match walks may see its slot given to a new
// worker that stores blocks: Match never names the removed worker with the
// new one's blocks.
func TestMatchNeverNamesAWorkerWithItsSlotSuccessorsBlocks(t *testing.T) {
	ix := newIndex(t)
	w1, w2 := wk(1), wk(2)
	var pB, qB []uint32
	extsP, extsQ := make([]H, 64), make([]H, 64)
	for i := range 64 {
		pB, qB = append(pB, uint32(i+1)), append(qB, uint32(1000+i))
		extsP[i], extsQ[i] = H(100+i), H(500+i)
	}
	pSeqs := seqsOf(prompt(pB...))
	var stop atomic.Bool
	var bad atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			var res indexer.MatchResult
			for !stop.Load() {
				ix.Match(pSeqs, &res)
				if _, ok := res.Find(w1); ok {
					bad.Add(1)
				}
			}
		})
	}
	for i := 0; i < 3000 && bad.Load() == 0; i++ {
		ix.RemoveWorker(w2) // w1 only ever stores Q, w2 only P; they take turns in one slot
		if err := ix.Apply(stored(w1, 0, 0, 0, extsQ, prompt(qB...))); err != nil {
			t.Fatal(err)
		}
		ix.RemoveWorker(w1)
		if err := ix.Apply(stored(w2, 0, 0, 0, extsP, prompt(pB...))); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if n := bad.Load(); n > 0 {
		t.Fatalf("Match named worker 1 holding prompt P %d times; it never stored any of it", n)
	}
}
