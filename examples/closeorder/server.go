package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// server answers the HTTP API.
type server struct {
	orders *orders
	log    *slog.Logger
	// idempotent wraps the POST handlers: Idempotency-Key handling scoped
	// to the caller.
	idempotent func(http.Handler) http.Handler
	// failing names the backends that do not answer.
	failing func(context.Context) []string
	// debug is warden's debug page: it is served on the admin listener
	// only, which the public cannot reach.
	debug http.Handler
	// metrics serves Prometheus's scrape of the service's metrics.
	metrics http.Handler
}

const userHeader = "X-User-ID"

type userKey struct{}

func userFrom(ctx context.Context) string { s, _ := ctx.Value(userKey{}).(string); return s }

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	// Validation runs before the idempotency middleware: a request refused
	// before any work is done does not use up its Idempotency-Key, so the
	// corrected retry with the same key goes through (as Stripe documents).
	mux.Handle("POST /orders", s.authenticated(validOrder(s.idempotent(http.HandlerFunc(s.createOrder)))))
	mux.Handle("POST /orders/{id}/pay", s.authenticated(s.idempotent(http.HandlerFunc(s.payOrder))))
	// Reads are the caller's own: another user's order is "not found".
	mux.Handle("GET /orders/{id}", s.authenticated(http.HandlerFunc(s.getOrder)))
	mux.Handle("GET /orders", s.authenticated(http.HandlerFunc(s.listOrders)))
	mux.HandleFunc("GET /healthz", s.health)
	return mux
}

// adminRoutes are the operator endpoints, for the admin listener alone:
// what a process holds and runs, and its metrics, tell an attacker as much
// as an operator.
func (s *server) adminRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /jobs/runs", s.listRuns)
	mux.HandleFunc("GET /healthz", s.health)
	mux.Handle("GET /debug/warden", s.debug)
	mux.Handle("GET /metrics", s.metrics)
	return mux
}

// authenticated stands in for real authentication: the caller names itself
// in X-User-ID. The idempotency middleware inside scopes keys by it.
func (s *server) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user := r.Header.Get(userHeader)
		if user == "" || len(user) > 128 {
			problem(w, http.StatusUnauthorized, "unauthenticated", "the "+userHeader+" header (1 to 128 characters) is required")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

// maxOrderBody bounds a POST /orders body.
const maxOrderBody = 1 << 16

// orderBody is a POST /orders body.
type orderBody struct {
	AmountCents *int64 `json:"amount_cents"`
}

// parseOrder reads and checks a POST /orders body.
func parseOrder(b []byte) (int64, bool) {
	var body orderBody
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.AmountCents == nil || *body.AmountCents <= 0 {
		return 0, false
	}
	return *body.AmountCents, true
}

// validOrder refuses a malformed POST /orders body before next runs, and
// hands next the body it read.
func validOrder(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(io.LimitReader(r.Body, maxOrderBody+1))
		if err != nil || len(b) > maxOrderBody {
			problem(w, http.StatusBadRequest, "invalid body", "the body could not be read, or is over 64 KiB")
			return
		}
		if _, ok := parseOrder(b); !ok {
			problem(w, http.StatusBadRequest, "invalid body", `want {"amount_cents": N} with N > 0`)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		next.ServeHTTP(w, r)
	})
}

func (s *server) createOrder(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxOrderBody))
	amount, ok := parseOrder(b)
	if err != nil || !ok {
		problem(w, http.StatusBadRequest, "invalid body", `want {"amount_cents": N} with N > 0`)
		return
	}
	ord, err := s.orders.create(r.Context(), userFrom(r.Context()), amount)
	if errors.Is(err, errInvalidInput) {
		problem(w, http.StatusBadRequest, "invalid body", err.Error())
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, ord)
}

func (s *server) payOrder(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		problem(w, http.StatusNotFound, "not found", "no such order")
		return
	}
	ord, err := s.orders.pay(r.Context(), userFrom(r.Context()), id)
	switch {
	case errors.Is(err, errNotFound):
		problem(w, http.StatusNotFound, "not found", "no such order")
	case errors.Is(err, errOrderClosed):
		problem(w, http.StatusConflict, "order closed", "the order was closed unpaid and can no longer be paid")
	case err != nil:
		s.internal(w, r, err)
	default:
		writeJSON(w, http.StatusOK, ord)
	}
}

func (s *server) getOrder(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		problem(w, http.StatusNotFound, "not found", "no such order")
		return
	}
	ord, err := s.orders.get(r.Context(), userFrom(r.Context()), id)
	if errors.Is(err, errNotFound) {
		problem(w, http.StatusNotFound, "not found", "no such order")
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ord)
}

func (s *server) listOrders(w http.ResponseWriter, r *http.Request) {
	status := r.URL.Query().Get("status")
	switch status {
	case "", statusUnpaid, statusPaid, statusClosed:
	default:
		problem(w, http.StatusBadRequest, "invalid status", "status must be unpaid, paid or closed")
		return
	}
	list, err := s.orders.list(r.Context(), userFrom(r.Context()), status)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if list == nil {
		list = []Order{}
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *server) listRuns(w http.ResponseWriter, r *http.Request) {
	limit := 50
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100000 {
			problem(w, http.StatusBadRequest, "invalid limit", "limit must be 1 to 100000")
			return
		}
		limit = n
	}
	runs, err := s.orders.runs(r.Context(), limit)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if runs == nil {
		runs = []JobRun{}
	}
	writeJSON(w, http.StatusOK, runs)
}

func (s *server) health(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	// The backends' errors go to the log: their text (addresses, users,
	// versions) is not for whoever can reach the API.
	if failing := s.failing(ctx); len(failing) > 0 {
		problem(w, http.StatusServiceUnavailable, "unhealthy", "not answering: "+strings.Join(failing, ", "))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *server) internal(w http.ResponseWriter, r *http.Request, err error) {
	s.log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "error", err)
	problem(w, http.StatusInternalServerError, "internal error", "the request failed; it may be retried with the same Idempotency-Key")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// problem writes an RFC 9457 problem document.
func problem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail})
}
