package dynamo

import (
	"fmt"
	"math"
	"sync/atomic"

	"github.com/kvroute/kvroute"
)

// dpStarts is a subscriber's table of data_parallel_start_rank by worker
// instance id, for workers whose ranks do not start at 0. It is replaced
// whole (SetDPStartRanks) and read by the subscriber's loop without a
// lock. The zero value is an empty table.
type dpStarts struct {
	p atomic.Pointer[map[uint64]uint32]
}

// set replaces the table with starts (copied; zero entries left out). It
// returns an error wrapping ErrConfig for a negative start or one beyond a
// uint32.
func (s *dpStarts) set(starts map[uint64]int) error {
	m := make(map[uint64]uint32, len(starts))
	for w, v := range starts {
		if v < 0 || int64(v) > math.MaxUint32 {
			return fmt.Errorf("%w: worker %x: data_parallel_start_rank %d", ErrConfig, w, v)
		}
		if v != 0 {
			m[w] = uint32(v)
		}
	}
	s.p.Store(&m)
	return nil
}

// get returns worker's start rank, 0 when the table does not name it.
func (s *dpStarts) get(worker uint64) uint32 {
	m := s.p.Load()
	if m == nil || len(*m) == 0 {
		return 0
	}
	return (*m)[worker]
}

// key returns the cache domain of Dynamo's worker and absolute
// data-parallel rank: the worker's rank counted from its start rank, as
// the router models a worker's ranks (0 to DataParallelRanks-1). It
// reports false for a rank below the worker's start rank.
func (s *dpStarts) key(worker uint64, rank uint32) (kvroute.WorkerKey, bool) {
	start := s.get(worker)
	if rank < start {
		return kvroute.WorkerKey{}, false
	}
	return kvroute.WorkerKey{ID: kvroute.WorkerID(worker), Rank: kvroute.DPRank(rank - start)}, true
}
