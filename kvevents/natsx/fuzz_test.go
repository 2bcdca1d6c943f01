package natsx

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/scheduling"
)

// wireSeeds returns one valid encoding of every message the package
// decodes.
func wireSeeds(t testing.TB) [][]byte {
	w := kvroute.WorkerKey{ID: 7, Rank: 1}
	add := loadOp{op: opAdd, id: 9, worker: w, prefillTokens: 64, prefillDone: true, output: 3, blocks: []kvroute.SeqHash{1, 2}}
	ev := kvroute.Event{Kind: kvroute.EventStored, Worker: w, ID: 4,
		Blocks: []kvroute.StoredBlock{{External: 5, Hash: 6}}, HasParent: true, Parent: 3}
	var d kvevents.DynamoEvent
	require.NoError(t, d.FromEvent(&ev, kvroute.Hasher{}))
	msg, err := kvevents.AppendDynamoEvent(nil, &d)
	require.NoError(t, err)
	dump, err := appendDumpChunk(nil, &dumpChunk{index: 1, final: true, last: []workerID{{worker: w, id: 4}}, events: []kvevents.DynamoEvent{d}})
	require.NoError(t, err)
	// Chunk 0 of a dump with the relays' epochs, one not known.
	epochDump, err := appendDumpChunk(nil, &dumpChunk{last: []workerID{{worker: w, id: 4, epoch: 1 << 62},
		{worker: kvroute.WorkerKey{ID: 8}, id: 2}}, events: []kvevents.DynamoEvent{d}})
	require.NoError(t, err)
	// A dump of sequence hashes (wire version 2).
	seqDump, err := appendDumpChunk(nil, &dumpChunk{index: 2, seqHashes: true, events: []kvevents.DynamoEvent{d}})
	require.NoError(t, err)
	return [][]byte{
		appendLoadBatch(nil, &loadBatch{origin: "a", incarnation: 2, seq: 3, ops: []loadOp{add, {op: opFree, id: 9}, {op: opOutput, id: 9, output: 4}}}),
		appendActiveChunk(nil, &activeChunk{index: 0, final: true, incarnation: 2, seq: 3, reqs: []activeReq{{ttlMillis: 500, op: add}}}),
		dump,
		epochDump,
		appendHaveReq(nil, &haveReq{from: "b", want: workerID{worker: w, id: 4, epoch: 9}}),
		appendHaveReq(nil, &haveReq{from: "b", want: workerID{worker: w, id: 4}}),
		appendWorkerIDs(nil, []workerID{{worker: w, epoch: 9}}),
		appendHeads(nil, &heads{epoch: 1, last: []workerID{{worker: w, id: 4}, {worker: kvroute.WorkerKey{ID: 8}, id: 2}}}),
		appendReplayReq(nil, &replayReq{worker: w, from: 2, to: 4}),
		appendReplayChunk(nil, &replayChunk{index: 0, final: true, ok: true, msgs: [][]byte{msg}}),
		seqDump,
	}
}

// decodeAll runs every decoder on p and returns how many accepted it; a
// rejection must wrap kvevents.ErrMalformed.
func decodeAll(t testing.TB, p []byte) int {
	ok := 0
	check := func(err error) {
		if err == nil {
			ok++
			return
		}
		if !errors.Is(err, kvevents.ErrMalformed) {
			t.Fatalf("error not wrapping ErrMalformed: %v", err)
		}
	}
	var b loadBatch
	check(decodeLoadBatch(p, &b))
	_, err := decodeActiveChunk(p)
	check(err)
	_, err = decodeDumpChunk(p)
	check(err)
	_, err = decodeHaveReq(p)
	check(err)
	_, err = decodeHeads(p)
	check(err)
	_, err = decodeReplayReq(p)
	check(err)
	_, err = decodeReplayChunk(p)
	check(err)
	_, err = readWorkerIDsMsg(p)
	check(err)
	return ok
}

func TestWireRoundTrip(t *testing.T) {
	for i, p := range wireSeeds(t) {
		require.GreaterOrEqual(t, decodeAll(t, p), 1, "seed %d decodes", i)
		for cut := range p { // every truncation is rejected cleanly
			decodeAll(t, p[:cut])
		}
	}
	var b loadBatch
	require.NoError(t, decodeLoadBatch(wireSeeds(t)[0], &b))
	require.Equal(t, "a", b.origin)
	require.Len(t, b.ops, 3)
	require.Equal(t, []kvroute.SeqHash{1, 2}, b.ops[0].blocks)
	require.Equal(t, 4, b.ops[2].output)

	// Epochs travel where known; entries without one read as epoch 0.
	c, err := decodeDumpChunk(wireSeeds(t)[3])
	require.NoError(t, err)
	require.Equal(t, []workerID{{worker: kvroute.WorkerKey{ID: 7, Rank: 1}, id: 4, epoch: 1 << 62},
		{worker: kvroute.WorkerKey{ID: 8}, id: 2}}, c.last)
	c, err = decodeDumpChunk(wireSeeds(t)[10])
	require.NoError(t, err)
	require.True(t, c.seqHashes)
	h, err := decodeHaveReq(wireSeeds(t)[4])
	require.NoError(t, err)
	require.Equal(t, uint64(9), h.want.epoch)
	h, err = decodeHaveReq(wireSeeds(t)[5])
	require.NoError(t, err)
	require.Zero(t, h.want.epoch)
	_, err = readWorkerIDsMsg(msgp.AppendArrayHeader(msgp.AppendArrayHeader(nil, 1), 5))
	require.ErrorIs(t, err, kvevents.ErrMalformed, "an entry of 5 elements without their bytes")
}

func FuzzWire(f *testing.F) {
	for _, p := range wireSeeds(f) {
		f.Add(p)
	}
	for _, c := range wireCases(f) { // with fields of a newer version
		f.Add(c.write(writer{extra: 2}))
	}
	f.Fuzz(func(t *testing.T, p []byte) { decodeAll(t, p) })
}

// loadOpBytes bounds every load operation's encoding, whatever its values.
func TestLoadOpBytesBound(t *testing.T) {
	maxW := kvroute.WorkerKey{ID: ^kvroute.WorkerID(0), Rank: ^kvroute.DPRank(0)}
	tests := []struct {
		name string
		op   loadOp
	}{
		{"free", loadOp{op: opFree, id: 1}},
		{"largest values", loadOp{op: opAdd, id: ^scheduling.RequestID(0), worker: maxW, prefillTokens: 1<<63 - 1,
			prefillDone: true, output: 1<<63 - 1, blocks: []kvroute.SeqHash{^kvroute.SeqHash(0), 1 << 63}}},
		{"many blocks", loadOp{op: opAdd, id: 1 << 40, worker: maxW, blocks: make([]kvroute.SeqHash, 70000)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range tt.op.blocks {
				tt.op.blocks[i] |= 1 << 63
			}
			require.LessOrEqual(t, len(appendLoadOp(nil, &tt.op)), loadOpBytes(&tt.op))
			a := appendActiveChunk(nil, &activeChunk{index: 1 << 60, incarnation: 1 << 62, seq: 1 << 61, reqs: []activeReq{{ttlMillis: -1, op: tt.op}}})
			require.LessOrEqual(t, len(a), msgFixedBytes+activeReqFixedBytes+loadOpBytes(&tt.op))
			b := appendLoadBatch(nil, &loadBatch{origin: "router-1", incarnation: 1 << 63, seq: 1 << 62, ops: []loadOp{tt.op}})
			require.LessOrEqual(t, len(b), msgFixedBytes+len("router-1")+loadOpBytes(&tt.op))
		})
	}
}
