package zklock

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
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

// frame is body as a frame of ZooKeeper's protocol, after its length.
func frame(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// hello is a connect response: protocol version, a 4000 ms timeout,
// session and password.
func hello(session uint64) []byte {
	b := binary.BigEndian.AppendUint32(nil, 0)
	b = binary.BigEndian.AppendUint32(b, 4000)
	b = binary.BigEndian.AppendUint64(b, session)
	b = binary.BigEndian.AppendUint32(b, 16)
	return frame(append(b, make([]byte, 16)...))
}

// TestSniffConnSendsCredentials: the credentials' setAuth requests are
// written once the connect response has been read, before the client
// library can write a request, and their answers are read and not passed
// on; an AUTH_FAILED answer fails the read with the refusal, which names
// the scheme and not the credential; a connect response without a session
// (it expired) sends nothing.
func TestSniffConnSendsCredentials(t *testing.T) {
	answer := func(xid, code int32) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(xid))
		b = binary.BigEndian.AppendUint64(b, 0)
		return frame(binary.BigEndian.AppendUint32(b, uint32(code)))
	}
	next := answer(7, 0)
	readFrame := func(r io.Reader) ([]byte, error) {
		var head [4]byte
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return nil, err
		}
		body := make([]byte, binary.BigEndian.Uint32(head[:]))
		_, err := io.ReadFull(r, body)
		return append(head[:], body...), err
	}
	for _, tc := range []struct {
		name    string
		session uint64
		code    int32
	}{
		{"accepted", 0x1234, 0},
		{"refused", 0x1234, authFailCode},
		{"no session", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server := net.Pipe()
			defer client.Close()
			defer server.Close()
			// A read that waits for what never comes fails the test.
			client.SetDeadline(time.Now().Add(10 * time.Second))
			server.SetDeadline(time.Now().Add(10 * time.Second))
			var creds credentials
			creds.set([]credential{{scheme: "digest", auth: []byte("u:s3cretpw")}})
			sc := newSniffConn(client, time.Second, func() {}, func(int32) {})
			sc.creds, sc.helloLeft = &creds, -1
			sent := make(chan []byte, 1)
			go func() {
				server.Write(hello(tc.session))
				got := make([]byte, len(creds.requests))
				n, _ := io.ReadFull(server, got)
				sent <- got[:n]
				if n == len(got) {
					server.Write(append(answer(authXid, tc.code), next...))
				}
			}()
			if f, err := readFrame(sc); err != nil || string(f) != string(hello(tc.session)) {
				t.Fatalf("connect response: %x, %v", f, err)
			}
			if tc.session == 0 {
				client.Close()
				if got := <-sent; len(got) != 0 {
					t.Fatalf("sent %x after a response without a session", got)
				}
				return
			}
			f, err := readFrame(sc)
			if got := <-sent; string(got) != string(creds.requests) {
				t.Fatalf("sent %x, want the setAuth requests %x", got, creds.requests)
			}
			if tc.code == 0 {
				if err != nil || string(f) != string(next) {
					t.Fatalf("frame after the credentials' answer: %x, %v; want %x", f, err, next)
				}
				return
			}
			if !errors.Is(err, zk.ErrAuthFailed) || !strings.Contains(err.Error(), `"u"`) || strings.Contains(err.Error(), "s3cret") || creds.refusal() == nil {
				t.Fatalf("read after AUTH_FAILED: %v, want the refusal naming the user and not the password", err)
			}
		})
	}
}

// TestSniffConnClosesOnHalfSentCredentials: when the credentials' setAuth
// requests could not be written whole (the server stopped reading until
// the write timed out), the connection is closed, so that no request of
// the client library's goes after a half-written packet, which the server
// would read as a part of it.
func TestSniffConnClosesOnHalfSentCredentials(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	server.SetDeadline(time.Now().Add(10 * time.Second))
	var creds credentials
	creds.set([]credential{{scheme: "digest", auth: []byte("u:s3cretpw")}})
	timedOut := make(chan struct{})
	sc := newSniffConn(client, 50*time.Millisecond, func() { close(timedOut) }, func(int32) {})
	sc.creds, sc.helloLeft = &creds, -1
	after := make(chan []byte, 1)
	go func() {
		server.Write(hello(0x1234))
		io.ReadFull(server, make([]byte, len(creds.requests)/2))
		<-timedOut
		// What the server reads once the write gave up.
		rest, _ := io.ReadAll(server)
		after <- rest
	}()
	if _, err := io.ReadFull(sc, make([]byte, len(hello(0x1234)))); err != nil {
		t.Fatalf("connect response: %v", err)
	}
	if _, err := sc.Read(make([]byte, 4)); err == nil {
		t.Fatal("read after a half-written setAuth succeeded")
	}
	if _, err := sc.Write(frame([]byte("next request"))); err == nil {
		t.Error("a write after the half-written setAuth went through")
	}
	if got := <-after; len(got) != 0 {
		t.Errorf("the server read %q after the half-written setAuth", got)
	}
}
