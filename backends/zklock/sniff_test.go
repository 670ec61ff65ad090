package zklock

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// readCounter counts the reads of the connection it wraps.
type readCounter struct {
	net.Conn
	reads int
}

func (c *readCounter) Read(p []byte) (int, error) {
	c.reads++
	return c.Conn.Read(p)
}

// TestSniffConnReadsFramesBuffered: frames read as the client library
// reads them (the length, then the rest) cost one read of the connection
// when they arrived together, and the negotiated timeout of the first
// (the connect response) is still sniffed.
func TestSniffConnReadsFramesBuffered(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	raw := &readCounter{Conn: client}
	var granted int32
	sc := newSniffConn(raw, time.Second, func() {}, func(ms int32) { granted = ms })

	// A connect response (protocol version, timeout 4000 ms, ...) and a
	// second frame, written at once.
	var wire []byte
	frame := func(body []byte) {
		wire = binary.BigEndian.AppendUint32(wire, uint32(len(body)))
		wire = append(wire, body...)
	}
	connect := binary.BigEndian.AppendUint32(nil, 0)
	connect = binary.BigEndian.AppendUint32(connect, 4000)
	connect = append(connect, make([]byte, 28)...)
	frame(connect)
	frame(make([]byte, 40))
	go func() { _, _ = server.Write(wire) }()

	for i, want := range []int{len(connect), 40} {
		var head [4]byte
		if _, err := io.ReadFull(sc, head[:]); err != nil {
			t.Fatalf("frame %d: length: %v", i, err)
		}
		n := binary.BigEndian.Uint32(head[:])
		if int(n) != want {
			t.Fatalf("frame %d: length %d, want %d", i, n, want)
		}
		if _, err := io.ReadFull(sc, make([]byte, n)); err != nil {
			t.Fatalf("frame %d: body: %v", i, err)
		}
	}
	if raw.reads != 1 {
		t.Errorf("%d reads of the connection for two frames written at once, want 1", raw.reads)
	}
	if granted != 4000 {
		t.Errorf("negotiated timeout sniffed as %d ms, want 4000", granted)
	}
}
