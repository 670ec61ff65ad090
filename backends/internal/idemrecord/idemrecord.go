// Package idemrecord is the layout shared by the idempotency stores that
// keep a record as one opaque value under a key of their own (etcd and
// Consul): the record's key, and the pieces of the binary encoding of its
// value. Each store composes its value from these pieces in its own order,
// behind its own format byte, so that the two stores' formats stay what
// they have always been while the byte-level reading and writing, and its
// bounds checks, exist once.
package idemrecord

import (
	"encoding/base64"
	"encoding/binary"

	"github.com/warden-go/warden/idempotency"
)

// Key returns the key of the record of (scope, key) under dir: dir, then
// the base64url (unpadded) of the scope's length as a uvarint, the scope and
// the key. It is unambiguous because the scope's length comes first, and
// base64url keeps NULs, '/' and '.' out of what follows dir, so any bytes
// are allowed in scope and key and no record nests under another.
func Key(dir, scope, key string) string {
	b := binary.AppendUvarint(make([]byte, 0, 2+len(scope)+len(key)), uint64(len(scope)))
	b = append(b, scope...)
	b = append(b, key...)
	return dir + base64.RawURLEncoding.EncodeToString(b)
}

// The state byte that follows the format byte.
const (
	stateInProgress byte = 1
	stateCompleted  byte = 2
)

// AppendHeader appends the two bytes every value starts with: format, the
// store's version of its layout, and the record's state.
func AppendHeader(b []byte, format byte, state idempotency.State) []byte {
	s := stateInProgress
	if state == idempotency.StateCompleted {
		s = stateCompleted
	}
	return append(b, format, s)
}

// AppendString appends s prefixed with its length as a uvarint.
func AppendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Reader reads a value laid out with AppendHeader, AppendString,
// binary.AppendUvarint and raw trailing bytes. Its methods are called in
// the order the value was written; the first that finds the value too short
// or malformed makes OK false, and every later one returns a zero value, so
// a decoder checks OK once, at the end.
type Reader struct {
	rest  []byte
	state idempotency.State
	bad   bool
}

// NewReader starts reading v, whose header must carry format and a known
// state.
func NewReader(v []byte, format byte) *Reader {
	r := &Reader{}
	switch {
	case len(v) < 2 || v[0] != format:
		r.bad = true
	case v[1] == stateInProgress:
		r.state = idempotency.StateInProgress
	case v[1] == stateCompleted:
		r.state = idempotency.StateCompleted
	default:
		r.bad = true
	}
	if !r.bad {
		r.rest = v[2:]
	}
	return r
}

// State is the record's state, from the header.
func (r *Reader) State() idempotency.State { return r.state }

// Uvarint reads a uvarint.
func (r *Reader) Uvarint() uint64 {
	if r.bad {
		return 0
	}
	u, n := binary.Uvarint(r.rest)
	if n <= 0 {
		r.bad = true
		return 0
	}
	r.rest = r.rest[n:]
	return u
}

// Field reads a string written by AppendString.
func (r *Reader) Field() string {
	l := r.Uvarint()
	if r.bad || l > uint64(len(r.rest)) {
		r.bad = true
		return ""
	}
	s := string(r.rest[:l])
	r.rest = r.rest[l:]
	return s
}

// Rest returns a copy of the bytes left, nil when there are none, and
// leaves none.
func (r *Reader) Rest() []byte {
	if r.bad || len(r.rest) == 0 {
		return nil
	}
	b := append([]byte(nil), r.rest...)
	r.rest = nil
	return b
}

// OK reports whether everything read so far was well formed.
func (r *Reader) OK() bool { return !r.bad }
