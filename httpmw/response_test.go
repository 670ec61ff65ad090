package httpmw

import (
	"net/http"
	"testing"
)

// TestResponseVersions: a response without trailers is written as version
// 1, which releases that know no trailers read; one with trailers as
// version 2, which they refuse rather than replay without its trailers.
func TestResponseVersions(t *testing.T) {
	h := http.Header{"Content-Type": {"text/plain"}}
	allowed := []string{"Content-Type", "Digest"}
	for _, c := range []struct {
		trailers http.Header
		version  byte
	}{
		{nil, responseV1},
		{http.Header{"X-Other": {"not allowed"}}, responseV1},
		{http.Header{"Digest": {"sha-256=abc"}}, responseV2},
	} {
		b := encodeResponse(201, h, c.trailers, allowed, []byte("made"))
		if b[0] != c.version {
			t.Errorf("trailers %v: version %d, want %d", c.trailers, b[0], c.version)
		}
		resp, err := decodeResponse(b)
		if err != nil {
			t.Fatalf("trailers %v: %v", c.trailers, err)
		}
		if resp.status != 201 || string(resp.body) != "made" || resp.header.Get("Content-Type") != "text/plain" ||
			resp.trailers.Get("Digest") != c.trailers.Get("Digest") {
			t.Errorf("trailers %v: decoded %+v", c.trailers, resp)
		}
	}
}
