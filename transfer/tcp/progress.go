package tcp

import (
	"io"
	"net"
	"time"
)

// progressChunk is the most a connection writes under one deadline: a
// write stalls when fewer than this many bytes leave in IOTimeout. One
// deadline per 256 KiB costs nothing next to moving them.
const progressChunk = 256 << 10

// progress reads and writes the middle of a frame so that Config.IOTimeout
// bounds a stall rather than the whole frame: each read, and each write of
// up to progressChunk bytes, gets a deadline of its own. A frame of any
// size then succeeds while its bytes keep moving, and a peer that stops
// moving them is declared dead after IOTimeout.
//
// The reader and the writer of one connection may be different goroutines:
// reads set only the read deadline, writes only the write deadline.
type progress struct {
	conn    net.Conn
	timeout time.Duration
}

// Read reads from the connection with a fresh read deadline.
func (p *progress) Read(b []byte) (int, error) {
	if err := p.conn.SetReadDeadline(time.Now().Add(p.timeout)); err != nil {
		return 0, err
	}
	return p.conn.Read(b)
}

// writeBuffers writes bufs, progressChunk bytes at most under each write
// deadline. It consumes bufs, as net.Buffers.WriteTo does.
func (p *progress) writeBuffers(bufs net.Buffers) error {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if total <= progressChunk {
		return p.write(&bufs)
	}
	// pieces is the backing array of each chunk, which WriteTo consumes.
	pieces := make(net.Buffers, 0, min(len(bufs), 256))
	var chunk net.Buffers
	for len(bufs) > 0 {
		pieces = pieces[:0]
		n := 0
		for len(bufs) > 0 && n < progressChunk {
			b := bufs[0]
			if room := progressChunk - n; len(b) > room {
				pieces = append(pieces, b[:room])
				bufs[0] = b[room:]
				break
			}
			pieces = append(pieces, b)
			n += len(b)
			bufs = bufs[1:]
		}
		chunk = pieces
		if err := p.write(&chunk); err != nil {
			return err
		}
	}
	return nil
}

// write writes one chunk under a fresh write deadline.
func (p *progress) write(chunk *net.Buffers) error {
	if err := p.conn.SetWriteDeadline(time.Now().Add(p.timeout)); err != nil {
		return err
	}
	_, err := chunk.WriteTo(p.conn)
	return err
}

// readHeader fills head, the header of the next frame: it waits on conn as
// long as it takes for the first bytes, and reads the rest with rd, which
// bounds a stall. A header that arrived whole costs one read.
func readHeader(conn net.Conn, rd io.Reader, head []byte) error {
	n, err := conn.Read(head)
	if n == len(head) {
		return nil
	}
	if err != nil {
		if err == io.EOF && n > 0 {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	_, err = io.ReadFull(rd, head[n:])
	return err
}
