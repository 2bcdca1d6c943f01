package indexer_test

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/indexer"
)

func Example() {
	hasher := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	ix, _ := indexer.New(indexer.Config{Hasher: hasher})

	system := []uint32{1, 2, 3, 4, 5, 6, 7, 8} // two blocks shared by every request
	a := kvroute.WorkerKey{ID: 1}
	b := kvroute.WorkerKey{ID: 2}

	// Worker a cached the system prompt and one user turn; b only the first block.
	blocks := hasher.AppendBlockHashes(nil, append(system, 9, 10, 11, 12))
	_ = ix.Apply(&kvroute.Event{Kind: kvroute.EventStored, Worker: a, ID: 1, Blocks: []kvroute.StoredBlock{
		{External: 101, Hash: blocks[0]}, {External: 102, Hash: blocks[1]}, {External: 103, Hash: blocks[2]},
	}})
	_ = ix.Apply(&kvroute.Event{Kind: kvroute.EventStored, Worker: b, ID: 1, Blocks: []kvroute.StoredBlock{
		{External: 201, Hash: blocks[0]},
	}})

	// A new request with the same system prompt and another user turn.
	seqs := hasher.AppendSeqHashes(nil, append(system, 13, 14, 15, 16))
	var res indexer.MatchResult
	ix.Match(seqs, &res)
	for _, w := range []kvroute.WorkerKey{a, b} {
		m, _ := res.Find(w)
		fmt.Printf("worker %s holds %d of %d blocks\n", w, m.Blocks, len(seqs))
	}
	// Output:
	// worker 1/0 holds 2 of 3 blocks
	// worker 2/0 holds 1 of 3 blocks
}

func ExampleIndex_Apply_gap() {
	ix, _ := indexer.New(indexer.Config{})
	w := kvroute.WorkerKey{ID: 7}
	_ = ix.Apply(&kvroute.Event{Kind: kvroute.EventCleared, Worker: w, ID: 41})
	err := ix.Apply(&kvroute.Event{Kind: kvroute.EventCleared, Worker: w, ID: 44})
	fmt.Println(err)
	// Output:
	// indexer: gap in event sequence of worker 7/0: want id 42, got 44
}

// A router that knows its engines' KV cache sizes has the index make room
// for them: every worker's by default, one worker's when it differs.
func ExampleIndex_ReserveWorker() {
	ix, _ := indexer.New(indexer.Config{WorkerBlocks: 8192}) // the engines' num_gpu_blocks
	big := kvroute.WorkerKey{ID: 3}
	ix.ReserveWorker(big, 32768) // a worker on a larger GPU
	fmt.Println(ix.Reservation(kvroute.WorkerKey{ID: 1}), ix.Reservation(big))
	ix.RemoveWorker(big)
	fmt.Println(ix.Reservation(big))
	// Output:
	// 8192 32768
	// 8192
}

type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time { return c.t }

func ExampleApprox() {
	hasher := kvroute.MustHasher(kvroute.HasherConfig{BlockSize: 4})
	clock := &fakeClock{t: time.Unix(0, 0)}
	ax, _ := indexer.NewApprox(indexer.ApproxConfig{TTL: time.Minute, Clock: clock, Index: indexer.Config{Hasher: hasher}})

	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	_, seqs := hasher.AppendHashes(nil, nil, prompt)
	ax.Insert(kvroute.WorkerKey{ID: 3}, seqs) // the router sent this prompt to worker 3

	var res indexer.MatchResult
	ax.Match(seqs, &res)
	fmt.Println(len(res.Workers), res.Blocks)

	clock.t = clock.t.Add(2 * time.Minute)
	fmt.Println(ax.Expire(), "blocks expired")
	// Output:
	// 1 2
	// 2 blocks expired
}
