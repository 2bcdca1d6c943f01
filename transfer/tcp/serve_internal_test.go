package tcp

import (
	"math"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/transfer"
)

// TestReadDescsAllocatesWhatArrived reads the descriptors of request
// frames as a target does. They must decode in order however many there
// are, and a frame whose header announces more than its peer sends must
// cost memory for the descriptors that arrived, not for the count the
// header claims: otherwise each connection of a hostile peer holds 24 MiB
// for 26 bytes sent. As in TestReadBytesAllocatesWhatArrived, the bytes
// allocated are the process's, so each case reads its frame
// readAllocTrials times and the least any read took is held to the bound.
func TestReadDescsAllocatesWhatArrived(t *testing.T) {
	for _, tc := range []struct {
		name  string
		count uint32 // announced in the header
		sent  int    // descriptors actually sent before the peer hangs up
		// maxAlloc bounds the bytes allocated while reading.
		maxAlloc uint64
	}{
		{"a few", 3, 3, 1 << 20},
		{"across several reads", 10_000, 10_000, 4 << 20},
		{"truncated after a few", maxFrameDescs, 10, 1 << 20},
		{"truncated after several reads", maxFrameDescs, 10_000, 4 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := make([]transfer.Desc, tc.sent)
			var wire []byte
			for i := range want {
				want[i] = transfer.Desc{Addr: uintptr(i) << 12, Len: uint64(i + 1), DevID: uint64(i % 3)}
				wire = appendDesc(wire, want[i])
			}
			least := leastAllocReading(wire, func(conn net.Conn, measure func(func())) {
				s := &server{conn: conn, body: &progress{conn: conn, timeout: 10 * time.Second}}
				var err error
				measure(func() { err = s.readDescs(reqHeader{kind: kindRead, count: tc.count}) })
				if int(tc.count) == tc.sent {
					require.NoError(t, err)
					require.Equal(t, want, s.descs)
				} else {
					require.Error(t, err)
				}
			})
			require.LessOrEqual(t, least, tc.maxAlloc, "bytes allocated reading %d of %d descriptors", tc.sent, tc.count)
		})
	}
}

// TestReadBytesAllocatesWhatArrived reads notification messages as a
// target does: a message reads whole however long, and a header that
// announces a long message its peer does not send costs memory for the
// bytes that arrived only. The bytes allocated are the process's, which
// the runtime and goroutines left by other tests add to now and then, so
// each case reads its message a few times and the least any read took
// is held to the bound: a read that allocated for what was announced
// exceeds it every time.
func TestReadBytesAllocatesWhatArrived(t *testing.T) {
	for _, tc := range []struct {
		name      string
		announced int
		sent      int
		maxAlloc  uint64
	}{
		{"empty", 0, 0, 1 << 10},
		{"short", 5, 5, 1 << 10},
		{"longer than the first buffer", 200 << 10, 200 << 10, 4 << 20},
		{"the longest", maxNotifLen, maxNotifLen, 8 << 20},
		{"truncated", maxNotifLen, 10, 128 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := make([]byte, tc.sent)
			for i := range want {
				want[i] = byte(i*13 + 5)
			}
			least := leastAllocReading(want, func(conn net.Conn, measure func(func())) {
				var got []byte
				var err error
				measure(func() { got, err = readBytes(conn, tc.announced) })
				if tc.announced == tc.sent {
					require.NoError(t, err)
					require.Equal(t, want, got)
				} else {
					require.Error(t, err)
				}
			})
			require.LessOrEqual(t, least, tc.maxAlloc, "bytes allocated reading %d of %d bytes", tc.sent, tc.announced)
		})
	}
}

// leastAllocReading runs read readAllocTrials times, each on the reading
// end of a new pipe whose other end writes wire and hangs up, and returns
// the fewest bytes the process allocated during the part of a read that
// read passes to measure. The bytes are the process's, which the runtime
// and goroutines left by other tests add to now and then: the least of a
// few reads is the read's own.
func leastAllocReading(wire []byte, read func(conn net.Conn, measure func(func()))) uint64 {
	least := uint64(math.MaxUint64)
	for range readAllocTrials {
		client, conn := net.Pipe()
		go func() {
			_, _ = client.Write(wire)
			_ = client.Close()
		}()
		func() {
			defer conn.Close()
			read(conn, func(f func()) {
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				f()
				runtime.ReadMemStats(&after)
				least = min(least, after.TotalAlloc-before.TotalAlloc)
			})
		}()
	}
	return least
}

// readAllocTrials is the number of reads leastAllocReading makes.
const readAllocTrials = 5
