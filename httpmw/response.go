package httpmw

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
)

// recorder buffers a handler's response so that it can be stored before it
// is sent. Headers go straight to the real writer's map (nothing is sent
// before WriteHeader there), so the handler sees the headers outer
// middleware set. A flush, a hijack, a 101 or a body past the limit turns it
// into a pass-through: the response is then streamed, and recorded as not
// replayable, with the status it had.
type recorder struct {
	w           http.ResponseWriter
	limit       int
	status      int
	wroteHeader bool
	direct      bool
	hijacked    bool
	body        bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.w.Header() }

func (r *recorder) WriteHeader(code int) {
	// net/http refuses such a code with a panic when the response is sent,
	// which here would come after the record was made, leaving the key
	// answered with a response no replay can write: the handler fails now,
	// as it would without the middleware.
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	switch {
	case r.direct:
		if !r.wroteHeader && (code >= 200 || code == http.StatusSwitchingProtocols) {
			r.status, r.wroteHeader = code, true
		}
		r.w.WriteHeader(code)
	case code == http.StatusSwitchingProtocols:
		// Final, unlike the other 1xx: what follows is another protocol on
		// the connection, which cannot be replayed.
		r.status, r.wroteHeader, r.direct = code, true, true
		r.w.WriteHeader(code)
	case code >= 100 && code < 200:
		// Informational responses (103 Early Hints) go out at once and are
		// not part of what is replayed.
		r.w.WriteHeader(code)
	case !r.wroteHeader:
		r.status, r.wroteHeader = code, true
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.direct {
		if !r.wroteHeader && !r.hijacked {
			r.status, r.wroteHeader = http.StatusOK, true
		}
		return r.w.Write(p)
	}
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	if r.body.Len()+len(p) > r.limit {
		if err := r.passThrough(); err != nil {
			return 0, err
		}
		return r.w.Write(p)
	}
	return r.body.Write(p)
}

// passThrough sends what was buffered and lets later writes through.
func (r *recorder) passThrough() error {
	if r.direct {
		return nil
	}
	r.direct = true
	if r.wroteHeader {
		r.w.WriteHeader(r.status)
	} else {
		// The write below sends net/http's implicit 200, which a later
		// WriteHeader cannot change.
		r.status, r.wroteHeader = http.StatusOK, true
	}
	_, err := r.w.Write(r.body.Bytes())
	r.body = bytes.Buffer{}
	return err
}

// Flush implements http.Flusher: a handler that flushes is streaming, so its
// response is sent as it goes and not stored.
func (r *recorder) Flush() {
	if r.passThrough() == nil {
		http.NewResponseController(r.w).Flush()
	}
}

// Hijack implements http.Hijacker: the connection leaves HTTP's hands, so
// nothing can be stored.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(r.w).Hijack()
	if err == nil {
		r.direct, r.hijacked = true, true
	}
	return conn, rw, err
}

// Unwrap lets http.ResponseController reach the real writer's other
// capabilities (deadlines, full duplex).
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// send writes the buffered response to the real writer.
func (r *recorder) send() {
	if r.direct {
		return
	}
	r.w.WriteHeader(r.statusCode())
	r.w.Write(r.body.Bytes())
}

// statusCode is the status the handler answered: 0 for a connection it
// hijacked without answering.
func (r *recorder) statusCode() int {
	switch {
	case r.wroteHeader:
		return r.status
	case r.hijacked:
		return 0
	}
	return http.StatusOK
}

// A stored response is versioned so that records written by one release
// are read correctly, or refused, by the next:
//
//	version 1: 0x01, the status as a uvarint, the number of header lines as
//	a uvarint, each line's name and value as a uvarint length and bytes,
//	then the body.
const responseV1 = 1

var errBadResponse = errors.New("stored response is malformed")

// encodeResponse encodes status, the allowed lines of h and body.
// Each allowed name is looked up once: a response has a few header fields
// and the allow list a dozen, and the lookups cost more than the encoding.
func encodeResponse(status int, h http.Header, allowed []string, body []byte) []byte {
	type field struct {
		name   string
		values []string
	}
	var room [16]field
	fields := room[:0]
	size, lines := 1+2*binary.MaxVarintLen64+len(body), 0
	for _, name := range allowed {
		if len(h) == len(fields) {
			break // every field of h is found
		}
		values := h[name]
		if len(values) == 0 {
			continue
		}
		fields = append(fields, field{name, values})
		for _, v := range values {
			size += 2*binary.MaxVarintLen64 + len(name) + len(v)
			lines++
		}
	}
	b := make([]byte, 0, size)
	b = append(b, responseV1)
	b = binary.AppendUvarint(b, uint64(status))
	b = binary.AppendUvarint(b, uint64(lines))
	for _, f := range fields {
		for _, v := range f.values {
			b = appendString(b, f.name)
			b = appendString(b, v)
		}
	}
	return append(b, body...)
}

// fitHeaders returns the allowed lines of h, in order, as long as they fit
// in limit bytes of record.
func fitHeaders(h http.Header, allowed []string, limit int) http.Header {
	fit := make(http.Header)
	size := 0
	for _, name := range allowed {
		for _, v := range h[name] {
			if size += 2*binary.MaxVarintLen64 + len(name) + len(v); size > limit {
				return fit
			}
			fit[name] = append(fit[name], v)
		}
	}
	return fit
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// storedResponse is a decoded stored response.
type storedResponse struct {
	status int
	header http.Header
	body   []byte
}

func decodeResponse(b []byte) (storedResponse, error) {
	if len(b) == 0 || b[0] != responseV1 {
		return storedResponse{}, errBadResponse
	}
	b = b[1:]
	status, n := binary.Uvarint(b)
	// 0 (hijacked) and 101 are only ever recorded as not replayable.
	if n <= 0 || (status != 0 && status != http.StatusSwitchingProtocols && status < 200) || status > 999 {
		return storedResponse{}, errBadResponse
	}
	b = b[n:]
	lines, n := binary.Uvarint(b)
	if n <= 0 || lines > uint64(len(b)) {
		return storedResponse{}, errBadResponse
	}
	b = b[n:]
	resp := storedResponse{status: int(status), header: make(http.Header, lines)}
	for range lines {
		var name, value string
		var ok bool
		if name, b, ok = readString(b); !ok {
			return storedResponse{}, errBadResponse
		}
		if value, b, ok = readString(b); !ok {
			return storedResponse{}, errBadResponse
		}
		resp.header[name] = append(resp.header[name], value)
	}
	resp.body = b
	return resp, nil
}

func readString(b []byte) (string, []byte, bool) {
	l, n := binary.Uvarint(b)
	if n <= 0 || l > uint64(len(b)-n) {
		return "", nil, false
	}
	return string(b[n : n+int(l)]), b[n+int(l):], true
}
