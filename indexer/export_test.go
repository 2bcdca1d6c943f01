package indexer

// SetSweepMin lowers the number of dead run positions from which ix sweeps
// dead run starts from its table, so that tests reach sweeps with small
// indexes.
func SetSweepMin(ix *Index, n int) { ix.sweepMin = n }
