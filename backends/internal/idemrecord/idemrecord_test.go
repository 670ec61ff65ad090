package idemrecord

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/warden-go/warden/idempotency"
)

func TestKey(t *testing.T) {
	if got, want := Key("app/", "scope/x", "key\x00y"), "app/B3Njb3BlL3hrZXkAeQ"; got != want {
		t.Errorf("Key = %q, want %q", got, want)
	}
	// The scope's length comes first: moving bytes between scope and key
	// changes the key.
	if Key("", "ab", "c") == Key("", "a", "bc") {
		t.Error("two (scope, key) pairs share a record key")
	}
}

func TestRoundTrip(t *testing.T) {
	b := AppendHeader(nil, 7, idempotency.StateCompleted)
	b = binary.AppendUvarint(b, 1<<40)
	b = AppendString(b, "fp")
	b = AppendString(b, "")
	b = append(b, "tail"...)
	r := NewReader(b, 7)
	u, fp, empty, rest := r.Uvarint(), r.Field(), r.Field(), r.Rest()
	if !r.OK() || r.State() != idempotency.StateCompleted || u != 1<<40 || fp != "fp" || empty != "" || string(rest) != "tail" {
		t.Fatalf("read back (%v, %v, %d, %q, %q, %q)", r.OK(), r.State(), u, fp, empty, rest)
	}
	if r.Rest() != nil {
		t.Error("Rest twice: bytes left")
	}
	in := NewReader(AppendHeader(nil, 7, idempotency.StateInProgress), 7)
	if !in.OK() || in.State() != idempotency.StateInProgress || in.Rest() != nil {
		t.Errorf("header only: (%v, %v)", in.OK(), in.State())
	}
}

func TestMalformed(t *testing.T) {
	good := AppendString(AppendHeader(nil, 1, idempotency.StateInProgress), "fingerprint")
	for name, v := range map[string][]byte{
		"empty":          nil,
		"format only":    {1},
		"other format":   {2, 1},
		"unknown state":  {1, 3},
		"zero state":     {1, 0},
		"short field":    good[:len(good)-1],
		"no length":      good[:2],
		"varint too big": append([]byte{1, 1}, bytes.Repeat([]byte{0xff}, 11)...),
	} {
		r := NewReader(v, 1)
		if r.Field(); r.OK() {
			t.Errorf("%s: %q read as well formed", name, v)
		}
		if r.Uvarint() != 0 || r.Field() != "" || r.Rest() != nil {
			t.Errorf("%s: a read after the failure returned a value", name)
		}
	}
}
