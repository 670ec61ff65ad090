package httpmw

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// FuzzParseKey: ParseKey never panics, accepts only keys within the limits,
// and reads back every key it accepts once written as an sf-string.
func FuzzParseKey(f *testing.F) {
	for _, seed := range []string{
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `8e03978e`, `"a\"b\\c"`, `""`, `"a";p=1`,
		`"a", "b"`, `"unclosed`, `  "spaced"  `, `"\x"`, "\"caf\xc3\xa9\"", `a,b`, strings.Repeat("k", 256),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		key, err := ParseKey(value)
		if err != nil {
			return
		}
		if key == "" || len(key) > MaxKeyLen {
			t.Fatalf("ParseKey(%q) accepted a key of %d bytes", value, len(key))
		}
		var sf strings.Builder
		sf.WriteByte('"')
		for i := range len(key) {
			c := key[i]
			if c < 0x20 || c > 0x7e {
				t.Fatalf("ParseKey(%q) accepted byte 0x%02x", value, c)
			}
			if c == '"' || c == '\\' {
				sf.WriteByte('\\')
			}
			sf.WriteByte(c)
		}
		sf.WriteByte('"')
		again, err := ParseKey(sf.String())
		if err != nil || again != key {
			t.Fatalf("ParseKey(%q) = %q, but its sf-string %s parses as (%q, %v)", value, key, sf.String(), again, err)
		}
	})
}

// FuzzDecodeResponse: a stored response, however corrupted, is decoded or
// refused without panicking, and what encodes decodes back.
func FuzzDecodeResponse(f *testing.F) {
	h := http.Header{"Content-Type": {"text/plain"}, "Location": {"/a", "/b"}}
	allowed := []string{"Content-Type", "Location", "Digest"}
	f.Add(encodeResponse(201, h, nil, allowed, []byte("body")))
	f.Add(encodeResponse(201, h, http.Header{"Digest": {"sha-256=x"}}, allowed, []byte("body")))
	f.Add([]byte{responseV1, 0xc8, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{responseV2, 0xc8, 0x00, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		resp, err := decodeResponse(b)
		if err != nil {
			return
		}
		var names []string
		for name := range resp.header {
			names = append(names, name)
		}
		for name := range resp.trailers {
			if resp.header[name] == nil {
				names = append(names, name)
			}
		}
		again, err := decodeResponse(encodeResponse(resp.status, resp.header, resp.trailers, names, resp.body))
		if err != nil || again.status != resp.status || !bytes.Equal(again.body, resp.body) ||
			len(again.header) != len(resp.header) || len(again.trailers) != len(resp.trailers) {
			t.Fatalf("round trip of %+v: %+v, %v", resp, again, err)
		}
	})
}
