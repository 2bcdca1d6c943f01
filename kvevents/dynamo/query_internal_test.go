package dynamo

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"io"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// queryStreamTreeDump is the response stream a dynamo.mocker worker
// (ai-dynamo 1.6.1, empty cache) sent on the callback connection of a
// worker_kv_query_source query with no event range: the handshake naming
// the stream's subject, the prologue, a TreeDump, the final marker and the
// sentinel control message.
const (
	queryStreamSubject  = "36c7a0ef-592b-4356-9b8e-9e020a089bce"
	queryStreamTreeDump = "000000000000004b000000000000000000000000000000007b227375626a656374223a2233366337613065662d353932622d343335362d396238652d396530323061303839626365222c2273747265616d5f74797065223a22726573706f6e7365227d000000000000000e000000000000000000000000000000007b226572726f72223a6e756c6c7d00000000000000000000000000000048000000000000000082a46461746181a85472656544756d7083a66576656e747390ad6c6173745f6576656e745f696400ab72657365745f73636f7065a3616c6cae636f6d706c6574655f66696e616cc200000000000000000000000000000011000000000000000081ae636f6d706c6574655f66696e616cc3000000000000000a000000000000000000000000000000002273656e74696e656c22"
)

func TestQueryStreamGolden(t *testing.T) {
	raw, err := hex.DecodeString(queryStreamTreeDump)
	require.NoError(t, err)
	resp, err := readQueryStream(bufio.NewReader(bytes.NewReader(raw)), queryStreamSubject)
	require.NoError(t, err)
	require.Equal(t, &QueryResponse{Kind: "TreeDump", ResetScope: "all"}, resp)

	// Another stream's handshake is refused.
	_, err = readQueryStream(bufio.NewReader(bytes.NewReader(raw)), "other")
	require.ErrorIs(t, err, ErrQuery)
	// A stream cut anywhere is an error, never a panic.
	for n := range len(raw) - 34 { // the final marker ends before the 34-byte sentinel
		_, err := readQueryStream(bufio.NewReader(bytes.NewReader(raw[:n])), queryStreamSubject)
		require.Error(t, err, "cut at %d", n)
	}
}

// queryStreamDomainDump is queryStreamTreeDump with reset_scope "domain"
// (Dynamo's runtime also defines that scope) instead of "all", the
// response's length grown by the 3 bytes.
func queryStreamDomainDump(t testing.TB) []byte {
	h := strings.Replace(queryStreamTreeDump, "00000000000000000000000000000048000000000000000082a4",
		"0000000000000000000000000000004b000000000000000082a4", 1)
	h = strings.Replace(h, "ab72657365745f73636f7065a3616c6c", "ab72657365745f73636f7065a6646f6d61696e", 1)
	raw, err := hex.DecodeString(h)
	if err != nil || h == queryStreamTreeDump {
		t.Fatal("the golden stream changed", err)
	}
	return raw
}

// A dump of another reset scope decodes with its scope, which a
// subscriber then refuses (checkResetScope).
func TestQueryStreamResetScope(t *testing.T) {
	resp, err := readQueryStream(bufio.NewReader(bytes.NewReader(queryStreamDomainDump(t))), queryStreamSubject)
	require.NoError(t, err)
	require.Equal(t, &QueryResponse{Kind: "TreeDump", ResetScope: "domain"}, resp)
	for _, tc := range []struct {
		scope string
		ok    bool
	}{{"", true}, {ResetScopeAll, true}, {"domain", false}, {"ALL", false}} {
		err := checkResetScope(tc.scope)
		if tc.ok {
			require.NoError(t, err, tc.scope)
			continue
		}
		require.ErrorIs(t, err, ErrResetScope, tc.scope)
		require.ErrorIs(t, err, ErrQuery, tc.scope)
		require.ErrorContains(t, err, strconv.Quote(tc.scope))
	}
}

func TestQueryFrame(t *testing.T) {
	start := uint64(7)
	f, err := queryFrame(RecoveryTarget{Address: "127.0.0.1:1", Path: "a/b/c", WorkerID: 5, DPRank: 1}, "id", "subj", "127.0.0.1:2", &start, nil)
	require.NoError(t, err)
	// [u16 path][path][u16 headers][headers][u32 len][two-part]
	require.Equal(t, []byte{0, 5, 'a', '/', 'b', '/', 'c'}, f[:7])
	hl := int(f[7])<<8 | int(f[8])
	rest := f[9+hl:]
	n := int(rest[0])<<24 | int(rest[1])<<16 | int(rest[2])<<8 | int(rest[3])
	require.Len(t, rest[4:], n)
	hdr, body, err := readTwoPart(bufio.NewReader(bytes.NewReader(rest[4:])))
	require.NoError(t, err)
	require.Contains(t, string(hdr), `"request_type":"single_in"`)
	require.Contains(t, string(hdr), `\"address\":\"127.0.0.1:2\"`)
	require.Contains(t, string(body), "start_event_id")
}

func TestParseRecoveryTarget(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want RecoveryTarget
		ok   bool
	}{
		{"127.0.0.1:38007/3e17825d9dc5e29d/kvroute/relay/worker_kv_query_source_1913718791a03c",
			RecoveryTarget{Address: "127.0.0.1:38007", Path: "3e17825d9dc5e29d/kvroute/relay/worker_kv_query_source_1913718791a03c", WorkerID: 9, DPRank: 1}, true},
		{"127.0.0.1:38007", RecoveryTarget{}, false},
		{"/path", RecoveryTarget{}, false},
		{"nohost/path", RecoveryTarget{}, false},
		{"", RecoveryTarget{}, false},
	} {
		got, err := ParseRecoveryTarget(tc.in, 9, 1)
		if !tc.ok {
			require.ErrorIs(t, err, ErrConfig, tc.in)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
}

// FuzzQueryStream: any bytes on a query's callback connection decode to a
// response or an error, never a panic.
func FuzzQueryStream(f *testing.F) {
	raw, err := hex.DecodeString(queryStreamTreeDump)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(raw)
	f.Add(queryStreamDomainDump(f))
	f.Fuzz(func(t *testing.T, p []byte) {
		_, _ = readQueryStream(bufio.NewReader(bytes.NewReader(p)), queryStreamSubject)
	})
}

// A message whose declared length the peer never sends fails with an
// unexpected EOF and costs memory for the bytes that came, not for the
// length declared (up to 2 × 256 MiB).
func TestQueryStreamDeclaredLengthNotAllocated(t *testing.T) {
	var h [24]byte
	binary.BigEndian.PutUint64(h[0:8], maxQueryMessage)
	binary.BigEndian.PutUint64(h[8:16], maxQueryMessage)
	in := append(h[:], "only a few bytes"...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := readQueryStream(bufio.NewReader(bytes.NewReader(in)), queryStreamSubject)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, ErrQuery)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "bytes allocated for a message that never came")

	// A long message that does arrive is read whole.
	body := bytes.Repeat([]byte{'x'}, 300<<10)
	binary.BigEndian.PutUint64(h[0:8], 0)
	binary.BigEndian.PutUint64(h[8:16], uint64(len(body)))
	hdr, got, err := readTwoPart(bufio.NewReader(bytes.NewReader(append(h[:], body...))))
	require.NoError(t, err)
	require.Empty(t, hdr)
	require.Equal(t, body, got)
}
