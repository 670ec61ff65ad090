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
	"net/http"
	"strings"
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
)

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
	header      string
	require     bool
	scope       func(*http.Request) string
	fingerprint func(r *http.Request, body []byte) string
	maxBody     int64
	maxResponse int
	replay      []string
	store       func(status int) bool
	failOpen    bool
	retryAfter  time.Duration
	exec        []idempotency.Option
	logger      *slog.Logger
	tracer      trace.TracerProvider
	meter       metric.MeterProvider
}

// WithMethods sets the methods guarded (default POST and PATCH); requests
// with other methods pass through untouched.
func WithMethods(methods ...string) IdempotencyOption {
	return func(c *idemConfig) {
		c.methods = make(map[string]bool, len(methods))
		for _, m := range methods {
			c.methods[strings.ToUpper(m)] = true
		}
	}
}

// WithHeader sets the request header carrying the key (default
// DefaultHeader).
func WithHeader(name string) IdempotencyOption {
	return func(c *idemConfig) { c.header = http.CanonicalHeaderKey(name) }
}

// WithRequireKey answers a guarded request without a key with 400, instead
// of passing it through unguarded.
func WithRequireKey() IdempotencyOption { return func(c *idemConfig) { c.require = true } }

// WithScope sets the function naming the principal a request acts for: keys
// are stored per (scope, key), so one principal can never be answered with
// another's stored response. It runs after authentication (place the
// middleware inside it) and should return the authenticated user or tenant
// ID. Default: one scope for all, which is only safe when keys cannot be
// guessed or the service has a single principal. Scopes longer than
// idempotency.MaxScopeLen are replaced by their SHA-256.
func WithScope(scope func(*http.Request) string) IdempotencyOption {
	return func(c *idemConfig) { c.scope = scope }
}

// WithFingerprint replaces the request fingerprint (default
// Fingerprint: method, path, query and body). A request that reuses a key
// with a different fingerprint gets 422.
func WithFingerprint(f func(r *http.Request, body []byte) string) IdempotencyOption {
	return func(c *idemConfig) { c.fingerprint = f }
}

// WithMaxBody bounds the request body read for the fingerprint (default
// DefaultMaxBody); a larger body gets 413.
func WithMaxBody(n int64) IdempotencyOption { return func(c *idemConfig) { c.maxBody = n } }

// WithMaxResponse bounds the response body that is stored (default
// DefaultMaxResponse). A larger response is streamed to the client, not
// stored, and the claim is released.
func WithMaxResponse(n int) IdempotencyOption { return func(c *idemConfig) { c.maxResponse = n } }

// WithReplayHeaders sets the response header fields stored and replayed
// (default: Cache-Control, Content-Disposition, Content-Encoding,
// Content-Language, Content-Location, Content-Type, ETag, Expires,
// Last-Modified, Link, Location, Vary). Set-Cookie, authorization and
// hop-by-hop fields are dropped from the list whatever it says.
func WithReplayHeaders(names ...string) IdempotencyOption {
	return func(c *idemConfig) { c.replay = names }
}

// WithStorePolicy decides from the handler's status whether its response is
// stored and replayed (true) or the claim released so that a retry runs the
// handler again (false). Default: store 2xx to 4xx except 429.
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

// WithRetryAfter sets the Retry-After sent with 409 (in progress) and 503
// (store unreachable); default DefaultRetryAfter.
func WithRetryAfter(d time.Duration) IdempotencyOption {
	return func(c *idemConfig) { c.retryAfter = d }
}

// WithWait makes a duplicate that arrives while the first request is in
// flight wait up to d for its response and replay it, instead of getting 409
// at once.
func WithWait(d time.Duration) IdempotencyOption {
	return func(c *idemConfig) { c.exec = append(c.exec, idempotency.WithWait(d)) }
}

// WithLease sets the in-progress lease (default idempotency.DefaultLease),
// renewed while the handler runs: how long a crashed server's claim blocks
// retries.
func WithLease(d time.Duration) IdempotencyOption {
	return func(c *idemConfig) { c.exec = append(c.exec, idempotency.WithLease(d)) }
}

// WithRetention sets how long a stored response is replayed (default
// idempotency.DefaultRetention).
func WithRetention(d time.Duration) IdempotencyOption {
	return func(c *idemConfig) { c.exec = append(c.exec, idempotency.WithRetention(d)) }
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

// DefaultStorePolicy stores 2xx to 4xx responses except 429: a 5xx or a
// 429 says the request did not take effect, so a retry should run it.
func DefaultStorePolicy(status int) bool {
	return status >= 200 && status < 500 && status != http.StatusTooManyRequests
}

// Fingerprint is the default request fingerprint: the SHA-256 of the method,
// the path, the raw query and the body, each length-prefixed so that no
// two different requests run together into the same input.
func Fingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, part := range []string{r.Method, r.URL.EscapedPath(), r.URL.RawQuery} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(part)))])
		io.WriteString(h, part)
	}
	h.Write(body)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
}

type keyCtx struct{}

// KeyFromContext returns the idempotency key of the request a handler
// serves under the Idempotency middleware, to pass on to downstream services
// (a payment provider's own idempotency key) so that a retry reaching them
// is deduplicated there too.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtx{}).(string)
	return k, ok
}

// errNotStored tells the executor to release the claim: the response is
// not one to replay.
var errNotStored = errors.New("httpmw: response not stored")

// Idempotency returns middleware that runs a request carrying an
// Idempotency-Key at most once per (scope, key) and replays its response to
// the retries, following the IETF httpapi Idempotency-Key draft:
//
//   - 400 for a malformed or repeated key (or a missing one with
//     WithRequireKey), 413 for a body larger than WithMaxBody;
//   - 409 with Retry-After while the first request is in flight (or a
//     bounded wait, WithWait), 422 when the key was used with a different
//     request;
//   - a replay carries the stored status, allow-listed headers and body,
//     plus Idempotent-Replayed: true;
//   - 503 when the store cannot be reached, unless WithFailOpen.
//
// A handler that panics has its claim released before the panic goes on up.
// A response that is streamed (Flush, Hijack), larger than WithMaxResponse,
// refused by the store policy, or whose client went away is not stored and
// its claim is released. Errors are RFC 9457 application/problem+json.
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
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.maxBody <= 0 || c.maxResponse <= 0 || c.maxResponse > idempotency.MaxResponseLen/2 || c.retryAfter < 0:
		return nil, fmt.Errorf("%w: body and response limits must be positive (the response's at most %d), Retry-After not negative",
			idempotency.ErrInvalid, idempotency.MaxResponseLen/2)
	case c.scope == nil || c.fingerprint == nil || c.store == nil || c.logger == nil || c.tracer == nil || c.meter == nil:
		return nil, fmt.Errorf("%w: nil scope, fingerprint, store policy, logger, tracer or meter provider", idempotency.ErrInvalid)
	case c.header == "":
		return nil, fmt.Errorf("%w: empty header name", idempotency.ErrInvalid)
	}
	var replay []string
	for _, name := range c.replay {
		if name = http.CanonicalHeaderKey(name); !neverReplayed[name] {
			replay = append(replay, name)
		}
	}
	c.replay = replay
	exec, err := idempotency.New(store, append([]idempotency.Option{
		idempotency.WithLogger(c.logger), idempotency.WithTracerProvider(c.tracer), idempotency.WithMeterProvider(c.meter),
	}, c.exec...)...)
	if err != nil {
		return nil, err
	}
	requests, err := c.meter.Meter(instrumentation).Int64Counter("warden.idempotency.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Requests with an idempotency key, by outcome: executed, replayed, in_progress, key_reused, unavailable, fail_open, canceled, error."))
	if err != nil {
		return nil, err
	}
	outcomes := map[string][]metric.AddOption{}
	for _, o := range []string{"executed", "replayed", "in_progress", "key_reused", "unavailable", "fail_open", "canceled", "error"} {
		outcomes[o] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("warden.outcome", o)))}
	}
	return func(next http.Handler) http.Handler {
		return &idempotent{cfg: &c, exec: exec, next: next, requests: requests, outcomes: outcomes}
	}, nil
}

// instrumentation names httpmw's meter.
const instrumentation = "github.com/warden-go/warden/httpmw"

type idempotent struct {
	cfg  *idemConfig
	exec *idempotency.Executor
	next http.Handler

	requests metric.Int64Counter
	outcomes map[string][]metric.AddOption
}

// count records the outcome of one keyed request.
func (m *idempotent) count(r *http.Request, outcome string) {
	m.requests.Add(r.Context(), 1, m.outcomes[outcome]...)
}

func (m *idempotent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := m.cfg
	if !c.methods[r.Method] {
		m.next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(c.header)
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
	body, err := io.ReadAll(io.LimitReader(r.Body, c.maxBody+1))
	switch {
	case err != nil:
		writeProblem(w, http.StatusBadRequest, "Unreadable_body", "Request body could not be read", "", 0)
		return
	case int64(len(body)) > c.maxBody:
		writeProblem(w, http.StatusRequestEntityTooLarge, "Body_too_large", "Request body too large",
			fmt.Sprintf("An idempotent request body is limited to %d bytes.", c.maxBody), 0)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	scope := c.scope(r)
	if len(scope) > idempotency.MaxScopeLen {
		sum := sha256.Sum256([]byte(scope))
		scope = "sha256:" + hex.EncodeToString(sum[:])
	}

	var rec *recorder
	res, err := m.exec.Do(r.Context(), key, c.fingerprint(r, body), func(ctx context.Context) ([]byte, error) {
		rec = &recorder{w: w, limit: c.maxResponse}
		m.next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, keyCtx{}, key)))
		if rec.direct || r.Context().Err() != nil || !c.store(rec.statusCode()) {
			return nil, errNotStored
		}
		// A record that headers swelled past what a store keeps is
		// refused by the executor, which releases the claim.
		return encodeResponse(rec.statusCode(), w.Header(), c.replay, rec.body.Bytes()), nil
	}, idempotency.WithScope(scope))

	if rec != nil {
		// The handler ran: its own response goes out whatever became of the
		// record (a failed completion is logged by the executor).
		m.count(r, "executed")
		rec.send()
		return
	}
	hash := func() string { return idempotency.KeyHash(scope, key) }
	switch {
	case err == nil:
		m.count(r, "replayed")
		m.replay(w, res.Response, hash)
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
		m.next.ServeHTTP(w, r)
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

// replay writes a stored response.
func (m *idempotent) replay(w http.ResponseWriter, stored []byte, hash func() string) {
	resp, err := decodeResponse(stored)
	if err != nil {
		m.cfg.logger.Error("httpmw: stored response unreadable", slog.String("key_hash", hash()), slog.Any("error", err))
		writeProblem(w, http.StatusInternalServerError, "Internal", "Stored response unreadable", "", 0)
		return
	}
	h := w.Header()
	for name, values := range resp.header {
		h[name] = values
	}
	h.Set(ReplayedHeader, "true")
	w.WriteHeader(resp.status)
	w.Write(resp.body)
}
