package httpmw

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
)

// recorder buffers a handler's response so that it can be stored before it
// is sent. Headers go straight to the real writer's map (nothing is sent
// before WriteHeader there), so the handler sees the headers outer
// middleware set. A flush, a hijack, a 101 or a body past the limit turns it
// into a pass-through: the response is then streamed, and recorded as not
// replayable, with the status it had.
//
// The header section is the map as it was when the handler chose its
// status, as net/http takes it: what the handler sets afterwards are the
// trailers it declared (and fields net/http would drop), which must not be
// sent, nor stored, as headers although the status goes out later here.
type recorder struct {
	w           http.ResponseWriter
	limit       int
	status      int
	wroteHeader bool
	direct      bool
	hijacked    bool
	body        bytes.Buffer
	section     http.Header // the header section, once the status is chosen
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
		r.section = r.w.Header().Clone()
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
	if !r.wroteHeader {
		// The write below sends net/http's implicit 200, which a later
		// WriteHeader cannot change.
		r.status, r.wroteHeader = http.StatusOK, true
	}
	r.writeHeader()
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
	if !r.wroteHeader {
		r.status, r.wroteHeader = http.StatusOK, true
	}
	r.writeHeader()
	r.w.Write(r.body.Bytes())
}

// writeHeader sends the status with the header section, and leaves in the
// real writer's map what the handler set after it: net/http sends the
// declared trailers from there once the handler returns.
func (r *recorder) writeHeader() {
	h := r.w.Header()
	if r.section == nil || sameHeader(h, r.section) {
		r.w.WriteHeader(r.status)
		return
	}
	later := h.Clone()
	clear(h)
	maps.Copy(h, r.section)
	r.w.WriteHeader(r.status)
	clear(h)
	maps.Copy(h, later)
}

// header is the response's header section: the map as it was when the
// handler chose its status, or as it is now if it has not yet.
func (r *recorder) header() http.Header {
	if r.section != nil {
		return r.section
	}
	return r.w.Header()
}

// trailers are the trailers the handler set, as net/http would send them:
// the fields its header section declared in Trailer with their values now,
// and the fields named with http.TrailerPrefix.
func (r *recorder) trailers() http.Header {
	var t http.Header
	h := r.w.Header()
	for _, v := range r.header()["Trailer"] {
		for name := range strings.SplitSeq(v, ",") {
			name = http.CanonicalHeaderKey(textproto.TrimString(name))
			if values := h[name]; name != "" && len(values) > 0 {
				if t == nil {
					t = make(http.Header)
				}
				t[name] = values
			}
		}
	}
	for k, values := range h {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok && len(values) > 0 {
			if t == nil {
				t = make(http.Header)
			}
			t[http.CanonicalHeaderKey(name)] = values
		}
	}
	return t
}

func sameHeader(a, b http.Header) bool {
	return len(a) == len(b) && maps.EqualFunc(a, b, slices.Equal)
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
//	version 2: as version 1, with the trailer lines, counted and encoded as
//	the header lines, between the header lines and the body.
//
// A response without trailers is written as version 1, which releases
// before version 2 read.
const (
	responseV1 = 1
	responseV2 = 2
)

var errBadResponse = errors.New("stored response is malformed")

// field is a header or trailer field with its values.
type field struct {
	name   string
	values []string
}

// allowedFields appends to fields the allowed fields of h, and returns
// them with the number of lines and the bytes they encode to, at most.
// Each allowed name is looked up once: a response has a few header fields
// and the allow list a dozen, and the lookups cost more than the encoding.
func allowedFields(fields []field, h http.Header, allowed []string) (_ []field, lines, size int) {
	found := 0
	for _, name := range allowed {
		if found == len(h) {
			break // every field of h is found
		}
		values := h[name]
		if len(values) == 0 {
			continue
		}
		found++
		fields = append(fields, field{name, values})
		for _, v := range values {
			size += 2*binary.MaxVarintLen64 + len(name) + len(v)
			lines++
		}
	}
	return fields, lines, size
}

// noSniff names a header line of a stored response that went out with no
// Content-Type because the handler suppressed net/http's sniffing (a nil
// Content-Type): its replay suppresses sniffing too, rather than add a
// Content-Type the first response had not. It is no valid field name, so
// no field of the handler's takes it, and a release that does not know it
// replays it as a field net/http drops.
const noSniff = "\x00no-sniff"

// sniffless reports whether body goes out under the header section h with
// no Content-Type, the handler having suppressed the one net/http would
// sniff. (A Transfer-Encoding of the handler's own stops HTTP/1's sniffing
// too, but not HTTP/2's, and a retry may come by either.)
func sniffless(h http.Header, body []byte) bool {
	v, ok := h["Content-Type"]
	return ok && len(v) == 0 && len(body) > 0
}

// encodeResponse encodes status, the allowed fields of h and of trailers,
// and body.
func encodeResponse(status int, h, trailers http.Header, allowed []string, body []byte) []byte {
	var room [16]field
	fields, lines, size := allowedFields(room[:0], h, allowed)
	if sniffless(h, body) {
		fields = append(fields, field{noSniff, []string{""}})
		lines++
		size += 2*binary.MaxVarintLen64 + len(noSniff)
	}
	n := len(fields)
	fields, tlines, tsize := allowedFields(fields, trailers, allowed)
	b := make([]byte, 0, 1+3*binary.MaxVarintLen64+size+tsize+len(body))
	if tlines == 0 {
		b = append(b, responseV1)
	} else {
		b = append(b, responseV2)
	}
	b = binary.AppendUvarint(b, uint64(status))
	b = appendFields(binary.AppendUvarint(b, uint64(lines)), fields[:n])
	if tlines > 0 {
		b = appendFields(binary.AppendUvarint(b, uint64(tlines)), fields[n:])
	}
	return append(b, body...)
}

func appendFields(b []byte, fields []field) []byte {
	for _, f := range fields {
		for _, v := range f.values {
			b = appendString(b, f.name)
			b = appendString(b, v)
		}
	}
	return b
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
	status   int
	header   http.Header
	trailers http.Header // nil without trailers
	body     []byte
	// noSniff: the response went out with no Content-Type, net/http
	// sniffing none (see noSniff).
	noSniff bool
}

func decodeResponse(b []byte) (storedResponse, error) {
	if len(b) == 0 || (b[0] != responseV1 && b[0] != responseV2) {
		return storedResponse{}, errBadResponse
	}
	version := b[0]
	b = b[1:]
	status, n := binary.Uvarint(b)
	// 0 (hijacked) and 101 are only ever recorded as not replayable.
	if n <= 0 || (status != 0 && status != http.StatusSwitchingProtocols && status < 200) || status > 999 {
		return storedResponse{}, errBadResponse
	}
	resp := storedResponse{status: int(status)}
	var ok bool
	if resp.header, b, ok = readFields(b[n:]); !ok {
		return storedResponse{}, errBadResponse
	}
	if _, resp.noSniff = resp.header[noSniff]; resp.noSniff {
		delete(resp.header, noSniff)
	}
	if version == responseV2 {
		if resp.trailers, b, ok = readFields(b); !ok || len(resp.trailers) == 0 {
			return storedResponse{}, errBadResponse
		}
	}
	resp.body = b
	return resp, nil
}

// readFields reads a count of lines and the lines.
func readFields(b []byte) (http.Header, []byte, bool) {
	lines, n := binary.Uvarint(b)
	if n <= 0 || lines > uint64(len(b)) {
		return nil, nil, false
	}
	b = b[n:]
	h := make(http.Header, lines)
	for range lines {
		var name, value string
		var ok bool
		if name, b, ok = readString(b); !ok {
			return nil, nil, false
		}
		if value, b, ok = readString(b); !ok {
			return nil, nil, false
		}
		h[name] = append(h[name], value)
	}
	return h, b, true
}

func readString(b []byte) (string, []byte, bool) {
	l, n := binary.Uvarint(b)
	if n <= 0 || l > uint64(len(b)-n) {
		return "", nil, false
	}
	return string(b[n : n+int(l)]), b[n+int(l):], true
}
