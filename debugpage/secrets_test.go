package debugpage_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/debugpage"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
)

// TestFingerprintIsKeyed: the fingerprint of a small body could be found
// by hashing guesses ({"amount_cents":1234} in 1234 of them); the page
// shows it keyed with a secret of its own, so the unsalted SHA-256 is not
// there, in whole or cut, and another Page shows another value.
func TestFingerprintIsKeyed(t *testing.T) {
	ctx := context.Background()
	store := idempotency.NewMemoryStore()
	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	fp := httpmw.Fingerprint(r, []byte(`{"amount_cents":1234}`))
	if _, err := store.Claim(ctx, idempotency.Claim{Scope: "user-1", Key: "k-1", Fingerprint: fp, Owner: "WHOLLYRANDOMTOKEN", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	shown := func() string {
		page, err := debugpage.New(g, debugpage.WithStore(store))
		if err != nil {
			t.Fatal(err)
		}
		var v debugpage.View
		for _, format := range []string{"", "&format=json"} {
			w := httptest.NewRecorder()
			page.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/debug/warden?scope=user-1&key=k-1"+format, nil))
			body := w.Body.String()
			if strings.Contains(body, fp[:16]) || strings.Contains(body, fp[len(fp)-16:]) {
				t.Fatalf("the page shows the unsalted fingerprint %s: %s", fp, body)
			}
			if strings.Contains(body, "WHOLLYRANDOMTOKEN") {
				t.Fatalf("the page shows the owner token: %s", body)
			}
			if format != "" {
				if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
					t.Fatal(err)
				}
			}
		}
		if v.Lookup == nil || v.Lookup.Fingerprint == "" || v.Lookup.Instance != "" {
			t.Fatalf("lookup %+v: want a fingerprint and no instance (the token names none)", v.Lookup)
		}
		return v.Lookup.Fingerprint
	}
	if a, b := shown(), shown(); a == b {
		t.Fatalf("two Pages show the same fingerprint %s: it is not keyed per Page", a)
	}
}

// TestSecurityHeaders: every answer, HTML, JSON or refusal, forbids
// sniffing and framing.
func TestSecurityHeaders(t *testing.T) {
	g, err := guard.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	page, err := debugpage.New(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*http.Request{
		httptest.NewRequest(http.MethodGet, "/debug/warden", nil),
		httptest.NewRequest(http.MethodGet, "/debug/warden?format=json", nil),
		httptest.NewRequest(http.MethodPost, "/debug/warden", nil),
	} {
		w := httptest.NewRecorder()
		page.ServeHTTP(w, r)
		h := w.Result().Header
		if h.Get("X-Content-Type-Options") != "nosniff" || !strings.Contains(h.Get("Content-Security-Policy"), "frame-ancestors 'none'") ||
			h.Get("X-Frame-Options") != "DENY" || h.Get("Referrer-Policy") != "no-referrer" {
			t.Errorf("%s %s: headers %v", r.Method, r.URL, h)
		}
	}
}

// What the page shows is UTF-8, as it is declared, even when what it was
// asked about is not: idempotency keys and scopes are opaque bytes.
func TestPageIsUTF8(t *testing.T) {
	g, err := guard.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	page, err := debugpage.New(g, debugpage.WithStore(idempotency.NewMemoryStore()))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"?scope=%FF&key=k%FE%00", "?format=json&scope=%FF&key=k%FE%00"} {
		rec := httptest.NewRecorder()
		page.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/"+q, nil))
		if rec.Code != http.StatusOK || !utf8.Valid(rec.Body.Bytes()) {
			t.Errorf("%s: status %d, valid UTF-8 %v: %q", q, rec.Code, utf8.Valid(rec.Body.Bytes()), rec.Body.String())
		}
	}
}
