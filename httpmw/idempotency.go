package httpmw

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden/idempotency"
)

// Defaults of the Idempotency middleware.
const (
	DefaultHeader      = "Idempotency-Key"
	DefaultMaxBody     = 1 << 20
	DefaultMaxResponse = 512 << 10
	DefaultRetryAfter  = time.Second
	// MaxBodyLimit is the largest WithMaxBody: the body is held in memory
	// to fingerprint it and hand it on to the handler.
	MaxBodyLimit = 1 << 30
)

// ErrShutdown is the cause of a handler's context when the server it runs
// in shuts down (http.Server.Shutdown), under WithShutdownCancel.
var ErrShutdown = errors.New("httpmw: server shutting down")

// ReplayedHeader marks a response replayed from the store.
const ReplayedHeader = "Idempotent-Replayed"

// defaultReplayHeaders are the response header fields stored and replayed
// unless WithReplayHeaders says otherwise: those that describe the
// representation, never credentials or per-connection fields.
var defaultReplayHeaders = []string{
	"Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language",
	"Content-Location", "Content-Type", "Etag", "Expires", "Last-Modified",
	"Link", "Location", "Vary",
}

// neverReplayed are refused in WithReplayHeaders: credentials would leak to
// whoever holds the key, and hop-by-hop fields describe one connection.
// Content-Length is recomputed from the body.
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Authorization": true, "Proxy-Authorization": true,
	"Www-Authenticate": true, "Proxy-Authenticate": true, "Connection": true, "Keep-Alive": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Content-Length": true, ReplayedHeader: true,
}

// IdempotencyOption configures the Idempotency middleware.
type IdempotencyOption func(*idemConfig)

type idemConfig struct {
	methods     map[string]bool
	methodList  []string
	header      string
	require     bool
	scope       func(*http.Request) string
	fingerprint func(r *http.Request, body []byte) string
	maxBody     int64
	maxResponse int
	replay      []string
	store       func(status int) bool
	failOpen    bool
	requestCtx  bool
	// shutdownCancel: the handler's context ends when its server shuts
	// down (WithShutdownCancel).
	shutdownCancel bool
	retryAfter     time.Duration
	exec           []idempotency.Option
	logger         *slog.Logger
	tracer         trace.TracerProvider
	meter          metric.MeterProvider
}

// WithMethods sets the methods guarded (default POST and PATCH), at least
// one, each a valid method token, matched whatever its case; requests with
// other methods pass through untouched.
func WithMethods(methods ...string) IdempotencyOption {
	return func(c *idemConfig) { c.methodList = append([]string{}, methods...) }
}

// WithHeader sets the request header carrying the key (default
// DefaultHeader); name must be a valid header field name.
func WithHeader(name string) IdempotencyOption {
	return func(c *idemConfig) { c.header = name }
}

// WithRequireKey answers a guarded request without a key with 400, instead
// of passing it through unguarded.
func WithRequireKey() IdempotencyOption { return func(c *idemConfig) { c.require = true } }

// WithScope sets the function naming the principal a request acts for: keys
// are stored per (scope, key), so one principal can never be answered with
// another's stored response. It runs after authentication (place the
// middleware inside it) and should return the authenticated user or tenant
// ID. Default: one scope for all, which is only safe when keys cannot be
// guessed or the service has a single principal. One middleware in front of
// several tenants' or services' handlers (a mux routing by host) needs a
// scope as well, since Fingerprint leaves the host out (a retry may come by
// another of a service's names): without one, a key used on one host
// answers the same request sent to another with the first host's response.
// Never scope by something the client says of itself (a header naming the
// user, or the host alone): that lets anyone reach anyone's responses by
// naming them. Scopes longer than idempotency.MaxScopeLen, and those
// beginning with idempotency.ReservedScopePrefix, are stored as their
// SHA-256, in a form no scope of that length can take (see storedScope).
func WithScope(scope func(*http.Request) string) IdempotencyOption {
	return func(c *idemConfig) { c.scope = scope }
}

// WithFingerprint replaces the request fingerprint (default
// Fingerprint: method, path, query and body), of any length: one longer
// than idempotency.MaxFingerprintLen is stored as its hash. A request that
// reuses a key with a different fingerprint gets 422. The body f is given
// is the request's, or, when a middleware before this one parsed it as a
// form (Request.ParseForm, FormValue, ParseMultipartForm), which leaves
// nothing to read, that form: a NUL, "form", a NUL and PostForm's
// encoding, then for each file its field, name, size and SHA-256.
func WithFingerprint(f func(r *http.Request, body []byte) string) IdempotencyOption {
	return func(c *idemConfig) { c.fingerprint = f }
}

// WithMaxBody bounds the request body read for the fingerprint (default
// DefaultMaxBody, at most MaxBodyLimit); a larger body gets 413.
func WithMaxBody(n int64) IdempotencyOption { return func(c *idemConfig) { c.maxBody = n } }

// WithMaxResponse bounds the response body that is stored (default
// DefaultMaxResponse, at most idempotency.MaxResponseLen/2). A larger
// response is streamed to the client and the key completed as executed, not
// replayable: its retries get 409 "Response not stored", never a second run.
func WithMaxResponse(n int) IdempotencyOption { return func(c *idemConfig) { c.maxResponse = n } }

// WithReplayHeaders sets the response header fields stored and replayed
// (default: Cache-Control, Content-Disposition, Content-Encoding,
// Content-Language, Content-Location, Content-Type, ETag, Expires,
// Last-Modified, Link, Location, Vary). Set-Cookie, authorization and
// hop-by-hop fields are dropped from the list whatever it says. The list
// names the trailers replayed too: a trailer it does not name reaches the
// first response only.
func WithReplayHeaders(names ...string) IdempotencyOption {
	return func(c *idemConfig) { c.replay = names }
}

// WithStorePolicy decides from the handler's status whether its outcome is
// kept (true: replayed, or recorded as not replayable) or the key freed so
// that a retry runs the handler again (false). The status is 0 for a
// connection the handler hijacked without answering. Default
// DefaultStorePolicy, which keeps every outcome; RetryableStorePolicy frees
// the key after a 5xx or 429.
func WithStorePolicy(store func(status int) bool) IdempotencyOption {
	return func(c *idemConfig) { c.store = store }
}

// WithMeterProvider sets where the warden.idempotency.requests metric, and
// the executor's warden.idempotency.store.duration, go (default otel's
// global MeterProvider).
func WithMeterProvider(mp metric.MeterProvider) IdempotencyOption {
	return func(c *idemConfig) { c.meter = mp }
}

// WithFailOpen runs the handler unguarded when the store cannot be reached,
// instead of answering 503.
func WithFailOpen() IdempotencyOption { return func(c *idemConfig) { c.failOpen = true } }

// WithRequestContext gives the handler the request's own context, which
// ends when the client goes away, as net/http does without this middleware.
// By default the handler's context does not end when its client leaves, only
// when the claim on its key is lost (or the server shuts down, under
// WithShutdownCancel), so that work a client stopped waiting for still
// finishes and is recorded. Either way, what the handler answers is kept as
// the store policy says: a handler that stops early should answer a status
// the policy does not keep if a retry is to run it again.
func WithRequestContext() IdempotencyOption { return func(c *idemConfig) { c.requestCtx = true } }

// WithShutdownCancel ends the handler's context, with cause ErrShutdown,
// when the http.Server it runs in starts shutting down. By default it does
// not, as net/http's request contexts do not: Shutdown waits for the
// handlers under way, which finish their work and have their answers
// stored, and a handler still running when the process exits leaves a
// claim that lapses after its lease, so that a retry runs it then, as
// after a crash. A handler stopped by this option answers something
// (a 503, or an empty 200 if it just returns), and that answer is kept as
// the store policy says: under DefaultStorePolicy, which keeps every
// answer, each request under way at a deploy would have its stopped answer
// replayed to its retries for the whole retention. Use it with a policy
// that frees the key for the statuses a stopped handler answers
// (RetryableStorePolicy, for a handler that answers 5xx when it stops).
// Ignored under WithRequestContext, whose context is the request's own.
func WithShutdownCancel() IdempotencyOption { return func(c *idemConfig) { c.shutdownCancel = true } }

// WithRetryAfter sets the Retry-After sent with 409 (in progress) and 503
// (store unreachable); default DefaultRetryAfter, never negative.
func WithRetryAfter(d time.Duration) IdempotencyOption {
	return func(c *idemConfig) { c.retryAfter = d }
}

// WithWait makes a duplicate that arrives while the first request is in
// flight wait up to d for its response and replay it, instead of getting 409
// at once.
func WithWait(d time.Duration) IdempotencyOption {
	return func(c *idemConfig) { c.exec = append(c.exec, idempotency.WithWait(d)) }
}

// WithLease sets the in-progress lease (default idempotency.DefaultLease,
// at least idempotency.MinDuration), renewed while the handler runs: how
// long a crashed server's claim blocks retries.
func WithLease(d time.Duration) IdempotencyOption {
	return func(c *idemConfig) { c.exec = append(c.exec, idempotency.WithLease(d)) }
}

// WithRetention sets how long a stored response is replayed (default
// idempotency.DefaultRetention).
func WithRetention(d time.Duration) IdempotencyOption {
	return func(c *idemConfig) { c.exec = append(c.exec, idempotency.WithRetention(d)) }
}

// WithCallTimeout bounds each call to the store (default
// idempotency.DefaultCallTimeout, at least idempotency.MinDuration): a
// store that does not answer within it gets the request 503, whatever its
// client does with the request's context. See idempotency.WithCallTimeout.
func WithCallTimeout(d time.Duration) IdempotencyOption {
	return func(c *idemConfig) { c.exec = append(c.exec, idempotency.WithCallTimeout(d)) }
}

// WithLogger sets the logger (default slog.Default()). Keys are logged only
// as hashes.
func WithLogger(l *slog.Logger) IdempotencyOption {
	return func(c *idemConfig) { c.logger = l }
}

// WithTracerProvider sets where spans go (default otel.GetTracerProvider()).
// Keys appear on spans only as hashes.
func WithTracerProvider(tp trace.TracerProvider) IdempotencyOption {
	return func(c *idemConfig) { c.tracer = tp }
}

// DefaultStorePolicy keeps every outcome of a handler that ran, as Stripe
// does: once the endpoint started executing, a retry gets what it answered,
// 5xx included, since a handler may fail after doing part of its work.
func DefaultStorePolicy(int) bool { return true }

// RetryableStorePolicy keeps every outcome except a 5xx or a 429, whose
// key is freed so that a retry runs the handler again: for handlers that
// answer those only when they did nothing (a transaction rolled back, a
// rate limit hit before any work). Not for a handler wrapped in
// http.TimeoutHandler inside the middleware: its 503 comes while the
// handler it wraps goes on working, and the freed key lets a retry run
// beside it.
func RetryableStorePolicy(status int) bool {
	return status < 500 && status != http.StatusTooManyRequests
}

// Fingerprint is the default request fingerprint: the SHA-256 of the method,
// the path the client sent (see requestPath), the raw query and the body,
// each length-prefixed so that no two different requests run together into
// the same input. The host is left out, so that a retry sent by another of
// the service's names replays; WithScope keeps hosts that serve different
// tenants apart.
func Fingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, part := range []string{r.Method, requestPath(r), r.URL.RawQuery} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(part)))])
		io.WriteString(h, part)
	}
	h.Write(body)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
}

// requestPath is the path of the request target as the client sent it,
// which handlers before the middleware leave alone when they rewrite
// r.URL: http.StripPrefix cuts its prefix from r.URL's path, and one
// middleware mounted under /orders/ and /payments/ would otherwise see one
// request in both mounts' POST /, and answer a payment sent with an order's
// key with the order, the payment never made. A target in origin form
// ("/path?query", as servers receive all but proxy requests) whose path
// r.URL no longer holds gives that path; any other (r.URL as parsed from
// the target, a target in absolute form, "*", a request made in process
// with no RequestURI) gives r.URL's escaped path, as releases before this
// one did for every request, so that their records still match.
func requestPath(r *http.Request) string {
	p, _, _ := strings.Cut(r.RequestURI, "?")
	if !strings.HasPrefix(p, "/") || p == r.URL.RawPath || p == r.URL.Path {
		return r.URL.EscapedPath()
	}
	return p
}

type keyCtx struct{}

// keyed is what the middleware tells the handler it calls, under keyCtx.
type keyed struct {
	key string
	// scope is the stored scope the key was claimed under; "" with guarded
	// false for WithFailOpen's unguarded runs.
	scope string
	// w is the ResponseWriter the middleware that claimed the key handed
	// the handler: what the response of the claimed request goes to.
	w       http.ResponseWriter
	guarded bool
}

// KeyFromContext returns the idempotency key of the request a handler
// serves under the Idempotency middleware (WithFailOpen's unguarded runs
// included), to pass on to downstream services (a payment provider's own
// idempotency key) so that a retry reaching them is deduplicated there too.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtx{}).(keyed)
	return k.key, ok
}

// guardedBy reports whether r, answered on w, is the very request an
// Idempotency middleware around this one claimed key in scope for: r's
// context says the key was claimed, and w is the writer that middleware
// handed on (or wraps it, as a ResponseWriter with an Unwrap method does).
// The same middleware applied twice (to a router and again to a route), or
// two on the same records, would otherwise have the inner one find the
// outer one's claim and answer 409 "in progress" (or 422, when the two
// fingerprint the request differently, or a middleware between them
// decodes its body), and the outer one keep that as the key's outcome, so
// that the handler never ran and every retry got it for the retention.
// Another request under the key, such as a handler's own in-process call to
// another guarded route with the request's context, answers to a writer of
// its own: it is no part of the outer claim, and is claimed, or refused, as
// any other, whatever its fingerprint.
func guardedBy(w http.ResponseWriter, r *http.Request, scope, key string) bool {
	k, ok := r.Context().Value(keyCtx{}).(keyed)
	if !ok || !k.guarded || k.scope != scope || k.key != key {
		return false
	}
	// Bounded: a writer whose Unwrap returns itself would loop.
	for range maxUnwrap {
		if w == k.w {
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
	return false
}

// maxUnwrap bounds the ResponseWriter wrappers guardedBy looks through.
const maxUnwrap = 32

// errNotStored tells the executor to release the claim: the store policy
// does not keep the outcome.
var errNotStored = errors.New("httpmw: outcome not kept by the store policy")

// errNotReplayable tells the executor that the handler ran but its response
// cannot be replayed; its bytes are the status and the headers that fit.
var errNotReplayable = fmt.Errorf("httpmw: response streamed, hijacked or too large: %w", idempotency.ErrNotReplayable)

// summaryHeaderLimit bounds the header lines kept with a response that is
// not replayable, whatever the handler set.
const summaryHeaderLimit = 16 << 10

// hashedScope begins every stored scope that is a hash. A literal scope
// that begins with it is hashed too, so no literal scope can be stored as a
// long scope's hash: the stored forms of two different scopes differ unless
// SHA-256 collides. So is one in warden's own namespace
// (idempotency.ReservedScopePrefix), which no request may claim keys in.
const hashedScope = "\x00sha256:"

// storedScope is the scope a request's keys are stored under.
func storedScope(scope string) string {
	if len(scope) <= idempotency.MaxScopeLen && !strings.HasPrefix(scope, hashedScope) && !strings.HasPrefix(scope, idempotency.ReservedScopePrefix) {
		return scope
	}
	sum := sha256.Sum256([]byte(scope))
	return hashedScope + hex.EncodeToString(sum[:])
}

// Idempotency returns middleware that runs a request carrying an
// Idempotency-Key at most once per (scope, key) and replays its response to
// the retries, following the IETF httpapi Idempotency-Key draft:
//
//   - 400 for a malformed or repeated key (or a missing one with
//     WithRequireKey), 413 for a body larger than WithMaxBody;
//   - 409 with Retry-After while the first request is in flight (or a
//     bounded wait, WithWait), 422 when the key was used with a different
//     request;
//   - a replay carries the stored status, allow-listed headers, body and
//     allow-listed trailers, plus Idempotent-Replayed: true; a retry of a request whose response
//     could not be stored gets 409 "Response not stored";
//   - 503 when the store cannot be reached, unless WithFailOpen.
//
// Once the handler has been called, its key is never run again, whatever
// the client does: a client that leaves does not end the handler's context
// (see WithRequestContext), and what the handler answers is stored. A
// response that cannot be replayed (streamed with Flush, a hijacked
// connection, a 101 Switching Protocols, larger than WithMaxResponse or than
// a store keeps) is recorded as executed, not replayable: its status and
// the allow-listed headers that fit, no body; a retry gets 409 "Response not
// stored". Only two things free the key for another run: a handler that
// panics (its claim is released before the panic goes on up) and an outcome
// WithStorePolicy chooses not to keep. A request whose key an enclosing
// Idempotency middleware has already claimed, in the same scope, passes
// through to the handler: that one runs it once and records its answer.
// Errors are RFC 9457 application/problem+json.
func Idempotency(store idempotency.Store, opts ...IdempotencyOption) (func(http.Handler) http.Handler, error) {
	c := idemConfig{
		methods:     map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		header:      DefaultHeader,
		scope:       func(*http.Request) string { return "" },
		fingerprint: Fingerprint,
		maxBody:     DefaultMaxBody,
		maxResponse: DefaultMaxResponse,
		replay:      defaultReplayHeaders,
		store:       DefaultStorePolicy,
		retryAfter:  DefaultRetryAfter,
		logger:      slog.Default(),
		tracer:      otel.GetTracerProvider(),
		meter:       otel.GetMeterProvider(),
	}
	if store == nil {
		return nil, fmt.Errorf("%w: httpmw: nil idempotency.Store", idempotency.ErrInvalid)
	}
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: httpmw: nil IdempotencyOption (argument %d)", idempotency.ErrInvalid, i)
		}
		o(&c)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	var replay []string
	for _, name := range c.replay {
		if name = http.CanonicalHeaderKey(name); !neverReplayed[name] {
			replay = append(replay, name)
		}
	}
	c.replay = replay
	base := []idempotency.Option{
		idempotency.WithLogger(c.logger), idempotency.WithTracerProvider(c.tracer), idempotency.WithMeterProvider(c.meter),
	}
	if !c.requestCtx {
		base = append(base, idempotency.WithDetachedRun())
	}
	exec, err := idempotency.New(store, append(base, c.exec...)...)
	if err != nil {
		return nil, err
	}
	requests, err := c.meter.Meter(instrumentation).Int64Counter("warden.idempotency.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Requests with an idempotency key, by outcome: executed, replayed, not_replayable, in_progress, key_reused, unavailable, fail_open, canceled, error."))
	if err != nil {
		return nil, err
	}
	outcomes := map[string][]metric.AddOption{}
	for _, o := range []string{"executed", "replayed", "not_replayable", "in_progress", "key_reused", "unavailable", "fail_open", "canceled", "error"} {
		outcomes[o] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("warden.outcome", o)))}
	}
	return func(next http.Handler) http.Handler {
		return &idempotent{cfg: &c, exec: exec, next: next, requests: requests, outcomes: outcomes,
			shutdowns: make(map[*http.Server]context.Context)}
	}, nil
}

// validToken reports whether s is an RFC 9110 token, the syntax of header
// field names and methods.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if c >= 0x7f || c <= ' ' || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// validate refuses, naming the option, every setting that could not work
// or would fail only once requests come.
func (c *idemConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: httpmw: "+format, append([]any{idempotency.ErrInvalid}, args...)...)
	}
	switch {
	case c.maxBody <= 0 || c.maxBody > MaxBodyLimit:
		return bad("WithMaxBody %d is outside 1 to %d", c.maxBody, MaxBodyLimit)
	case c.maxResponse <= 0 || c.maxResponse > idempotency.MaxResponseLen/2:
		return bad("WithMaxResponse %d is outside 1 to %d", c.maxResponse, idempotency.MaxResponseLen/2)
	case c.retryAfter < 0:
		return bad("WithRetryAfter %v is negative", c.retryAfter)
	case c.scope == nil:
		return bad("nil WithScope")
	case c.fingerprint == nil:
		return bad("nil WithFingerprint")
	case c.store == nil:
		return bad("nil WithStorePolicy")
	case c.logger == nil:
		return bad("nil WithLogger")
	case c.tracer == nil:
		return bad("nil WithTracerProvider")
	case c.meter == nil:
		return bad("nil WithMeterProvider")
	case !validToken(c.header):
		return bad("WithHeader %q is not a valid header field name", c.header)
	}
	c.header = http.CanonicalHeaderKey(c.header)
	if c.methodList != nil {
		if len(c.methodList) == 0 {
			return bad("WithMethods names no method")
		}
		c.methods = make(map[string]bool, len(c.methodList))
		for _, m := range c.methodList {
			// A method is a token (RFC 9110 section 9.1), as a field name is.
			if !validToken(m) {
				return bad("WithMethods %q is not a valid method", m)
			}
			c.methods[strings.ToUpper(m)] = true
		}
	}
	return nil
}

// instrumentation names httpmw's meter.
const instrumentation = "github.com/warden-go/warden/httpmw"

type idempotent struct {
	cfg  *idemConfig
	exec *idempotency.Executor
	next http.Handler

	requests metric.Int64Counter
	outcomes map[string][]metric.AddOption

	mu sync.Mutex
	// shutdowns holds, per server the middleware has served, a context
	// cancelled when that server shuts down: one RegisterOnShutdown per
	// server, not one per request.
	shutdowns map[*http.Server]context.Context
}

// shutdownOf returns the context that ends when the server serving r shuts
// down, or nil when r did not come through an http.Server.
func (m *idempotent) shutdownOf(r *http.Request) context.Context {
	srv, _ := r.Context().Value(http.ServerContextKey).(*http.Server)
	if srv == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ctx, ok := m.shutdowns[srv]; ok {
		return ctx
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	srv.RegisterOnShutdown(func() {
		cancel(ErrShutdown)
		// A server that shut down serves no more requests: forget it.
		m.mu.Lock()
		delete(m.shutdowns, srv)
		m.mu.Unlock()
	})
	m.shutdowns[srv] = ctx
	return ctx
}

// handlerContext is the context the handler runs with: run, the executor's
// (which ends only when the claim is lost, unless WithRequestContext), ended
// also when the server shuts down under WithShutdownCancel.
func (m *idempotent) handlerContext(r *http.Request, run context.Context) (context.Context, func()) {
	if !m.cfg.shutdownCancel || m.cfg.requestCtx {
		return run, func() {}
	}
	sd := m.shutdownOf(r)
	if sd == nil {
		return run, func() {}
	}
	ctx, cancel := context.WithCancelCause(run)
	stop := context.AfterFunc(sd, func() { cancel(context.Cause(sd)) })
	return ctx, func() {
		stop()
		cancel(nil)
	}
}

// count records the outcome of one keyed request.
func (m *idempotent) count(r *http.Request, outcome string) {
	m.requests.Add(r.Context(), 1, m.outcomes[outcome]...)
}

func (m *idempotent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := m.cfg
	// Methods are matched whatever their case: a handler that does not
	// look at the method serves "post" as it serves POST, and must not run
	// it once per retry.
	if !c.methods[r.Method] && !c.methods[strings.ToUpper(r.Method)] {
		m.next.ServeHTTP(w, r)
		return
	}
	values := r.Header[c.header] // canonical since validate
	switch {
	case len(values) == 0 && c.require:
		writeProblem(w, http.StatusBadRequest, "Missing_key", "Idempotency key missing",
			fmt.Sprintf("This operation requires an %s header.", c.header), 0)
		return
	case len(values) == 0:
		m.next.ServeHTTP(w, r)
		return
	case len(values) > 1:
		writeProblem(w, http.StatusBadRequest, "Invalid_key", "Invalid idempotency key",
			fmt.Sprintf("The %s header must appear once.", c.header), 0)
		return
	}
	key, err := ParseKey(values[0])
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "Invalid_key", "Invalid idempotency key", err.Error(), 0)
		return
	}
	src := r.Body
	if src == nil {
		// A request made in process, not by a server, may have none.
		src = http.NoBody
	}
	body, err := io.ReadAll(io.LimitReader(src, c.maxBody+1))
	var outer *http.MaxBytesError
	switch {
	case errors.As(err, &outer):
		// An outer http.MaxBytesHandler's limit, lower than WithMaxBody.
		writeProblem(w, http.StatusRequestEntityTooLarge, "Body_too_large", "Request body too large",
			fmt.Sprintf("The request body is limited to %d bytes.", outer.Limit), 0)
		return
	case err != nil:
		writeProblem(w, http.StatusBadRequest, "Unreadable_body", "Request body could not be read", "", 0)
		return
	case int64(len(body)) > c.maxBody:
		c.bodyTooLarge(w)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	scope := storedScope(c.scope(r))
	if guardedBy(w, r, scope, key) {
		// An outer Idempotency claimed this very key: it runs the request
		// once and records what the handler answers.
		m.next.ServeHTTP(w, r)
		return
	}
	fpBody, err := bodyToFingerprint(r, body, c.maxBody)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		c.bodyTooLarge(w)
		return
	case err != nil:
		// The server's setup, not the client's request: said where its
		// operators look, and counted.
		m.count(r, "error")
		c.logger.ErrorContext(r.Context(), "httpmw: request not fingerprinted: its body was read before the middleware",
			slog.String("key_hash", idempotency.KeyHash(scope, key)), slog.Any("error", err))
		// The cause (a temporary file's path, say) stays in the log.
		writeProblem(w, http.StatusInternalServerError, "Body_consumed", "Request body already read",
			"A handler or middleware before the idempotency middleware read the request body, or the form it parsed from it cannot be read, so the request cannot be fingerprinted; the server's log says which.", 0)
		return
	}

	var rec *recorder
	aborted := false
	res, err := m.exec.Do(r.Context(), key, c.fingerprint(r, fpBody), func(ctx context.Context) (out []byte, err error) {
		hctx, done := m.handlerContext(r, ctx)
		defer done()
		rec = &recorder{w: w, limit: c.maxResponse}
		defer func() {
			// http.ErrAbortHandler once the handler has chosen its status
			// is net/http's way to cut short a response under way:
			// httputil.ReverseProxy panics with it when the upstream's
			// answer, the work done, cannot be copied to the client. The
			// work must not run again, so it is recorded as executed and
			// the panic goes on once the record is made. Any other panic,
			// or one before a status, frees the key (see the package doc);
			// a panic not recovered here keeps its stack.
			if !rec.wroteHeader {
				return
			}
			if v := recover(); v != nil {
				if v != http.ErrAbortHandler {
					panic(v)
				}
				aborted = true
				status := rec.statusCode()
				if !c.store(status) {
					out, err = nil, errNotStored
					return
				}
				out, err = encodeResponse(status, fitHeaders(rec.header(), c.replay, summaryHeaderLimit), nil, c.replay, nil), errNotReplayable
			}
		}()
		m.next.ServeHTTP(rec, r.WithContext(context.WithValue(hctx, keyCtx{}, keyed{key: key, scope: scope, w: rec, guarded: true})))
		status := rec.statusCode()
		if !c.store(status) {
			return nil, errNotStored
		}
		if !rec.direct {
			// Headers can swell a record past what a store keeps; it is
			// then recorded like a streamed one.
			if b := encodeResponse(status, rec.header(), rec.trailers(), c.replay, rec.body.Bytes()); len(b) <= idempotency.MaxResultLen {
				return b, nil
			}
		}
		return encodeResponse(status, fitHeaders(rec.header(), c.replay, summaryHeaderLimit), nil, c.replay, nil), errNotReplayable
	}, idempotency.WithScope(scope))

	if rec != nil {
		// The handler ran: its own response goes out whatever became of the
		// record (a failed completion is logged by the executor).
		m.count(r, "executed")
		if aborted {
			panic(http.ErrAbortHandler)
		}
		rec.send()
		return
	}
	hash := func() string { return idempotency.KeyHash(scope, key) }
	switch {
	case err == nil:
		m.count(r, "replayed")
		m.replay(w, res.Response, hash)
	case errors.Is(err, idempotency.ErrNotReplayable):
		m.count(r, "not_replayable")
		m.notReplayable(w, res.Response)
	case errors.Is(err, idempotency.ErrInProgress):
		m.count(r, "in_progress")
		writeProblem(w, http.StatusConflict, "In_progress", "Request in progress",
			"A request with this idempotency key is still being processed; retry later.", c.retryAfter)
	case errors.Is(err, idempotency.ErrFingerprintMismatch):
		m.count(r, "key_reused")
		writeProblem(w, http.StatusUnprocessableEntity, "Key_reused", "Idempotency key reused",
			"This idempotency key was used with a different request.", 0)
	case errors.Is(err, idempotency.ErrUnavailable) && c.failOpen:
		m.count(r, "fail_open")
		c.logger.LogAttrs(r.Context(), slog.LevelWarn, "httpmw: idempotency store unavailable; serving unguarded",
			slog.String("key_hash", hash()), slog.Any("error", err))
		// The key goes on with it: a downstream service's deduplication
		// (KeyFromContext) is all that guards the request now.
		m.next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), keyCtx{}, keyed{key: key})))
	case errors.Is(err, idempotency.ErrUnavailable):
		m.count(r, "unavailable")
		c.logger.LogAttrs(r.Context(), slog.LevelError, "httpmw: idempotency store unavailable",
			slog.String("key_hash", hash()), slog.Any("error", err))
		writeProblem(w, http.StatusServiceUnavailable, "Store_unavailable", "Idempotency store unavailable",
			"", c.retryAfter)
	case r.Context().Err() != nil:
		// The client left while waiting: no one reads the answer.
		m.count(r, "canceled")
		writeProblem(w, http.StatusServiceUnavailable, "Canceled", "Request canceled", "", 0)
	default:
		m.count(r, "error")
		c.logger.LogAttrs(r.Context(), slog.LevelError, "httpmw: idempotency failed",
			slog.String("key_hash", hash()), slog.Any("error", err))
		writeProblem(w, http.StatusInternalServerError, "Internal", "Idempotency failed", "", 0)
	}
}

// notReplayable answers a retry of a request that was executed but whose
// response could not be stored, telling the status it had when it is known.
func (m *idempotent) notReplayable(w http.ResponseWriter, summary []byte) {
	detail := "The request with this idempotency key was executed, but its response could not be stored (streamed, hijacked or too large); it is not run again."
	if resp, err := decodeResponse(summary); err == nil && resp.status != 0 {
		detail = fmt.Sprintf("The request with this idempotency key was executed with status %d, but its response could not be stored (streamed, hijacked or too large); it is not run again.", resp.status)
		if loc := resp.header.Get("Location"); loc != "" {
			w.Header().Set("Location", loc)
		}
	}
	w.Header().Set(ReplayedHeader, "true")
	writeProblem(w, http.StatusConflict, "Response_not_stored", "Response not stored", detail, 0)
}

// replay writes a stored response.
func (m *idempotent) replay(w http.ResponseWriter, stored []byte, hash func() string) {
	resp, err := decodeResponse(stored)
	if err == nil && resp.status < 200 {
		err = errBadResponse // only ever recorded as not replayable
	}
	if err != nil {
		m.cfg.logger.Error("httpmw: stored response unreadable", slog.String("key_hash", hash()), slog.Any("error", err))
		writeProblem(w, http.StatusInternalServerError, "Internal", "Stored response unreadable", "", 0)
		return
	}
	h := w.Header()
	for name, values := range resp.header {
		h[name] = values
	}
	if resp.noSniff {
		h["Content-Type"] = nil
	}
	h.Set(ReplayedHeader, "true")
	for name := range resp.trailers {
		h.Add("Trailer", name)
	}
	w.WriteHeader(resp.status)
	w.Write(resp.body)
	for name, values := range resp.trailers {
		h[name] = values
	}
}

// bodyToFingerprint is what the fingerprint takes for the body read from
// r: the body itself, or, when a middleware before this one parsed the body
// as a form (CSRF checks and RFC 6750 access tokens read the form), which
// leaves nothing to read, the form: without it a retry with the same key
// and another form would be answered the first one's response. Its
// encoding starts with a NUL, which no form body (URL-encoded text) does.
// The body the form came from is held to maxBody as a body is (an error
// wrapping *http.MaxBytesError past it): its Content-Length, or when that
// is unknown the sizes of the form's names, values and files.
//
// A body with a known length of which nothing was left to read, and no
// form parsed from it, was read by a middleware before this one: an error
// says so, rather than a fingerprint that leaves it out. One of unknown
// length (chunked) that was drained looks like an empty body, and one
// read in part, or rewritten (a decompressing middleware that leaves
// Content-Length as it was), cannot be told from a body whose length
// changed on the way: those are fingerprinted as they are read.
func bodyToFingerprint(r *http.Request, body []byte, maxBody int64) ([]byte, error) {
	mf := r.MultipartForm
	// ParseForm leaves a PostForm, empty or not, once it read a form body
	// (and reads no other, nor the body of any method but these three, for
	// which it leaves an empty one all the same).
	readsBody := r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch
	parsed := ((r.PostForm != nil && readsBody) || mf != nil) && isForm(r.Header.Get("Content-Type"))
	if len(body) > 0 || r.ContentLength == 0 || !parsed {
		if len(body) == 0 && r.ContentLength > 0 {
			return nil, fmt.Errorf("none of the %d bytes of the request body was left to read: a handler or middleware before the idempotency middleware read it, so the request cannot be fingerprinted; put the idempotency middleware before it", r.ContentLength)
		}
		return body, nil
	}
	var b bytes.Buffer
	b.WriteString("\x00form\x00")
	b.WriteString(r.PostForm.Encode())
	size := r.ContentLength
	if size < 0 {
		size = 0
		for name, values := range r.PostForm {
			for _, v := range values {
				size += int64(len(name) + len(v))
			}
		}
	}
	var names []string
	if mf != nil {
		for name, fhs := range mf.File {
			names = append(names, name)
			if r.ContentLength < 0 {
				for _, fh := range fhs {
					size += fh.Size
				}
			}
		}
	}
	if size > maxBody {
		return nil, &http.MaxBytesError{Limit: maxBody}
	}
	slices.Sort(names)
	for _, name := range names {
		for _, fh := range mf.File[name] {
			sum, err := fileSum(fh)
			if err != nil {
				return nil, fmt.Errorf("the file %q of field %q, parsed by a middleware before the idempotency middleware, cannot be read to fingerprint it: %w", fh.Filename, name, err)
			}
			fmt.Fprintf(&b, "\x00file\x00%q\x00%q\x00%d\x00%x", name, fh.Filename, fh.Size, sum)
		}
	}
	return b.Bytes(), nil
}

// bodyTooLarge answers a request whose body, or the form parsed from it
// before the middleware, is past WithMaxBody.
func (c *idemConfig) bodyTooLarge(w http.ResponseWriter) {
	writeProblem(w, http.StatusRequestEntityTooLarge, "Body_too_large", "Request body too large",
		fmt.Sprintf("An idempotent request body is limited to %d bytes.", c.maxBody), 0)
}

// isForm reports whether contentType is one whose body ParseForm or
// ParseMultipartForm reads.
func isForm(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/x-www-form-urlencoded" || mt == "multipart/form-data")
}

// fileSum is the SHA-256 of a parsed multipart file.
func fileSum(fh *multipart.FileHeader) ([]byte, error) {
	f, err := fh.Open()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}
