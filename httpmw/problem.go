package httpmw

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// problemBase prefixes the type URI of every problem this package answers
// with; each type is documented at that anchor of the package documentation.
const problemBase = "https://pkg.go.dev/github.com/warden-go/warden/httpmw#hdr-"

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// writeProblem answers with a problem+json body. retryAfter, when positive,
// becomes a Retry-After in whole seconds, rounded up so that a client
// honouring it never comes back early.
func writeProblem(w http.ResponseWriter, status int, anchor, title, detail string, retryAfter time.Duration) {
	body, _ := json.Marshal(problem{Type: problemBase + anchor, Title: title, Status: status, Detail: detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	if retryAfter > 0 {
		// Rounded up by the remainder, not by adding a second less a
		// nanosecond first, which overflows for the longest durations.
		secs := retryAfter / time.Second
		if retryAfter%time.Second != 0 {
			secs++
		}
		h.Set("Retry-After", strconv.FormatInt(int64(secs), 10))
	}
	w.WriteHeader(status)
	w.Write(body)
}
