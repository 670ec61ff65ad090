// Package debugpage serves a page that answers an operator's first
// questions about one process during an incident: which locks it holds,
// with which tokens and until when; which of them others are waiting for;
// what its scheduler ran last and runs next; and what an idempotency store
// holds under a key. The same data comes as JSON with ?format=json.
//
// The page is rendered on the server (html/template) with its styles inline
// and no scripts or external assets, so it works behind any proxy and on a
// phone; its answers forbid framing, sniffing and referrers. It tells
// operators what a process is doing, which is for operators only: mount it
// on a listener of its own that the public cannot reach (loopback, or an
// admin network), never on a service's public API.
//
//	page, err := debugpage.New(g, debugpage.WithScheduler(s), debugpage.WithStore(store))
//	mux.Handle("GET /debug/warden", page)
//
// It shows no secrets: idempotency owner tokens (which would let a reader
// complete or abandon a claim) are cut to the instance that made them
// (Instance), stored responses are shown by size only, and request
// fingerprints, which a reader could test guessed bodies against, are shown
// keyed with a secret the Page draws at New (equal requests show equal
// values on one Page, and nothing can be checked against them elsewhere).
package debugpage

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/scheduler"
)

// Option configures a page.
type Option func(*Page)

// WithScheduler adds the scheduler's jobs: schedule, next slot and last run.
func WithScheduler(s *scheduler.Scheduler) Option { return func(p *Page) { p.sched = s } }

// WithStore adds a lookup of one idempotency record (?scope=&key=).
func WithStore(s idempotency.Store) Option { return func(p *Page) { p.store = s } }

// WithInspectTimeout bounds the backend calls one page view makes to count
// the waiters of the held locks (default 1s), and separately its
// idempotency record lookup; a backend that does not answer in time leaves
// the counts (or the record) out instead of hanging the page.
func WithInspectTimeout(d time.Duration) Option { return func(p *Page) { p.timeout = d } }

// Page is the debug page, an http.Handler.
type Page struct {
	g       *guard.Guard
	sched   *scheduler.Scheduler
	store   idempotency.Store
	timeout time.Duration
	// secret keys the fingerprints shown, so that they cannot be matched
	// against the hashes of guessed requests.
	secret [32]byte
}

// New returns the page for g. A nil Guard or a non-positive timeout is an
// error wrapping guard.ErrInvalidOption.
func New(g *guard.Guard, opts ...Option) (*Page, error) {
	if g == nil {
		return nil, fmt.Errorf("debugpage: %w: nil Guard", guard.ErrInvalidOption)
	}
	p := &Page{g: g, timeout: time.Second}
	rand.Read(p.secret[:])
	for _, o := range opts {
		if o != nil {
			o(p)
		}
	}
	if p.timeout <= 0 {
		return nil, fmt.Errorf("debugpage: %w: inspect timeout %v is not positive", guard.ErrInvalidOption, p.timeout)
	}
	return p, nil
}

// maxInspected bounds the backend calls of one page view: a process holding
// thousands of locks gets its page, with waiters counted for the first ones.
const maxInspected = 200

// View is what the page shows, and the JSON it serves.
type View struct {
	Owner   string    `json:"owner"`
	Backend string    `json:"backend"`
	Now     time.Time `json:"now"`
	Held    []Held    `json:"held"`
	// WaitersUnknown says why the waiter counts are missing, if they are.
	WaitersUnknown string   `json:"waiters_unknown,omitempty"`
	Jobs           []Job    `json:"jobs,omitempty"`
	Lookup         *Lookup  `json:"lookup,omitempty"`
	HasStore       bool     `json:"-"`
	HasJobs        bool     `json:"-"`
	Contended      []string `json:"contended"`
}

// Held is one lock this process holds.
type Held struct {
	guard.HeldLock
	// Waiters is how many others wait for it, -1 when unknown.
	Waiters int `json:"waiters"`
}

// Job is one scheduler job.
type Job struct {
	Name string    `json:"name"`
	Spec string    `json:"spec"`
	Next time.Time `json:"next"`
	// Last is the job's latest run, nil before its first.
	Last *Run `json:"last,omitempty"`
}

// Run is a scheduler.RunRecord as the page shows it: its error as text,
// which a Go error value does not marshal to.
type Run struct {
	Slot     time.Time         `json:"slot"`
	Instance string            `json:"instance"`
	Token    uint64            `json:"token,omitempty"`
	Term     uint64            `json:"term,omitempty"`
	Started  time.Time         `json:"started"`
	Finished time.Time         `json:"finished"`
	Outcome  scheduler.Outcome `json:"outcome"`
	Reason   string            `json:"reason,omitempty"`
	Err      string            `json:"error,omitempty"`
}

// Lookup is the answer to an idempotency record lookup.
type Lookup struct {
	Scope string `json:"scope"`
	Key   string `json:"key"`
	// Found is false when the store has no live record under the key.
	Found    bool   `json:"found"`
	State    string `json:"state,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Fingerprint is the record's request fingerprint keyed with the
	// Page's secret (HMAC-SHA-256, 16 bytes in hex).
	Fingerprint string `json:"fingerprint,omitempty"`
	Response    int    `json:"response_bytes"`
	Err         string `json:"error,omitempty"`
}

// ServeHTTP implements http.Handler.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	// Inline styles only; nothing may load or run from elsewhere, and no
	// other site may frame the page.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	v := p.view(r.Context(), r)
	if r.URL.Query().Get("format") == "json" {
		h.Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v) // the client went away: nothing to do
		return
	}
	// Rendered whole first: what the page shows may hold bytes that are
	// not UTF-8 (an idempotency key or scope asked for, which are opaque
	// bytes; a job's error), which html/template passes through, and the
	// page is declared UTF-8. encoding/json replaces them alike.
	var out bytes.Buffer
	if err := page.Execute(&out, v); err != nil {
		p.g.Logger().Warn("warden/debugpage: rendering failed", "error", err)
		http.Error(w, "rendering failed", http.StatusInternalServerError)
		return
	}
	h.Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(bytes.ToValidUTF8(out.Bytes(), []byte("\uFFFD"))) // the client went away: nothing to do
}

// view gathers the page's data.
func (p *Page) view(ctx context.Context, r *http.Request) View {
	v := View{Owner: p.g.Owner(), Backend: p.g.Backend(), Now: time.Now(), HasStore: p.store != nil, HasJobs: p.sched != nil}
	ictx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	for i, h := range p.g.Held() {
		held := Held{HeldLock: h, Waiters: -1}
		if i == maxInspected && v.WaitersUnknown == "" {
			v.WaitersUnknown = fmt.Sprintf("only the first %d locks are asked about", maxInspected)
		}
		if v.WaitersUnknown == "" {
			in, err := p.g.Inspect(ictx, h.Key)
			if err != nil {
				v.WaitersUnknown = err.Error()
			} else {
				held.Waiters = in.Waiters
			}
		}
		if held.Waiters > 0 {
			v.Contended = append(v.Contended, h.Key)
		}
		v.Held = append(v.Held, held)
	}
	if p.sched != nil {
		for _, e := range p.sched.Entries() {
			j := Job{Name: e.Name, Spec: e.Spec, Next: e.Next}
			if r := e.Last; r != nil {
				j.Last = &Run{Slot: r.Slot, Instance: r.Instance, Token: r.Token, Term: r.Term,
					Started: r.Started, Finished: r.Finished, Outcome: r.Outcome, Reason: r.Reason}
				if r.Err != nil {
					j.Last.Err = r.Err.Error()
				}
			}
			v.Jobs = append(v.Jobs, j)
		}
	}
	if q := r.URL.Query(); p.store != nil && q.Get("key") != "" {
		// A bound of its own: a lock backend that stopped answering has
		// used up the count's, and the store may be another server.
		lctx, cancel := context.WithTimeout(ctx, p.timeout)
		defer cancel()
		v.Lookup = p.lookup(lctx, q.Get("scope"), q.Get("key"))
	}
	return v
}

func (p *Page) lookup(ctx context.Context, scope, key string) *Lookup {
	l := &Lookup{Scope: scope, Key: key}
	rec, err := p.store.Get(ctx, scope, key)
	switch {
	case err == nil:
		l.Found, l.State, l.Response = true, string(rec.State), len(rec.Response)
		l.Instance = Instance(rec.Owner)
		if rec.Fingerprint != "" {
			mac := hmac.New(sha256.New, p.secret[:])
			mac.Write([]byte(rec.Fingerprint))
			l.Fingerprint = hex.EncodeToString(mac.Sum(nil)[:16])
		}
	case errors.Is(err, idempotency.ErrNotFound):
	default:
		l.Err = err.Error()
	}
	return l
}

// Instance returns the instance label an idempotency owner token starts
// with, "instance:...", as the scheduler's do, or "" when it has none (the
// Executor's tokens are random through and through). The rest of a token is
// a capability: whoever has it can complete or abandon the claim, so only
// the label is ever shown.
func Instance(owner string) string {
	inst, _, ok := strings.Cut(owner, ":")
	if !ok {
		return ""
	}
	return inst
}
