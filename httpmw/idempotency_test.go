package httpmw_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/httpmw/httpmwtest"
	"github.com/warden-go/warden/idempotency"
)

func TestIdempotencyMemoryStore(t *testing.T) {
	st := idempotency.NewMemoryStore()
	httpmwtest.Run(t, func(testing.TB) idempotency.Store { return st })
}

// TestHandlerContextEndsOnShutdown: under WithShutdownCancel, the
// handler's context, which outlives its client, ends when the server shuts
// down, with cause ErrShutdown.
func TestHandlerContextEndsOnShutdown(t *testing.T) {
	mw, err := httpmw.Idempotency(idempotency.NewMemoryStore(), httpmw.WithShutdownCancel())
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	cause := make(chan error, 1)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
		cause <- context.Cause(r.Context())
		w.WriteHeader(http.StatusServiceUnavailable)
	})))
	defer srv.Close()
	answered := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", `"shutdown"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Config.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if c := <-cause; !errors.Is(c, httpmw.ErrShutdown) {
		t.Errorf("handler's context cause %v, want ErrShutdown", c)
	}
	if status := <-answered; status != http.StatusServiceUnavailable {
		t.Errorf("client got %d, want the handler's 503", status)
	}
}

// TestHandlerFinishesAcrossShutdown: by default a server's Shutdown does not
// end the context of a handler under way, as net/http's does not: the
// handler finishes its work, its answer is stored, and a retry sent to the
// next server on the same store gets it replayed, with no second run. (With
// the context ended at Shutdown, the handler's stopped answer was stored
// and replayed instead.)
func TestHandlerFinishesAcrossShutdown(t *testing.T) {
	store := idempotency.NewMemoryStore()
	var runs atomic.Int32
	started := make(chan struct{})
	finish := make(chan struct{})
	handlerDone := make(chan struct{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			defer close(handlerDone)
		}
		select {
		case <-finish:
		case <-r.Context().Done():
			http.Error(w, "stopped: "+context.Cause(r.Context()).Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created")
	})
	serve := func() *httptest.Server {
		mw, err := httpmw.Idempotency(store)
		if err != nil {
			t.Fatal(err)
		}
		return httptest.NewServer(mw(handler))
	}
	post := func(url string) (int, string, string) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", `"deploy"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error(), ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header.Get(httpmw.ReplayedHeader)
	}
	old := serve()
	defer old.Close()
	shuttingDown := make(chan struct{})
	old.Config.RegisterOnShutdown(func() { close(shuttingDown) })
	type answer struct {
		status int
		body   string
	}
	first := make(chan answer, 1)
	go func() {
		status, body, _ := post(old.URL)
		first <- answer{status, body}
	}()
	<-started
	shutdown := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		shutdown <- old.Config.Shutdown(ctx)
	}()
	<-shuttingDown
	// A handler whose context Shutdown ended would answer within this
	// while (at once, in practice); one that goes on is then let finish.
	select {
	case <-handlerDone:
	case <-time.After(300 * time.Millisecond):
	}
	close(finish)
	if err := <-shutdown; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if a := <-first; a.status != http.StatusCreated || a.body != "created" {
		t.Errorf("request under way at Shutdown: %d %q, want 201 \"created\"", a.status, a.body)
	}
	next := serve()
	defer next.Close()
	status, body, replayed := post(next.URL)
	if status != http.StatusCreated || body != "created" || replayed != "true" {
		t.Errorf("retry on the next server: %d %q replayed=%q, want the first run's 201 \"created\" replayed", status, body, replayed)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// TestFormParsedUpstream: a middleware before Idempotency that parsed the
// body as a form (a CSRF check, an access token in the form) leaves nothing
// to read; the parsed form is fingerprinted instead, so that the same key
// with another form gets 422, not the first form's answer, and the same
// form is replayed. A body read otherwise gets 500, the handler not run.
func TestFormParsedUpstream(t *testing.T) {
	var runs atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charged %s", r.PostFormValue("amount"))
	})
	mw, err := httpmw.Idempotency(idempotency.NewMemoryStore())
	if err != nil {
		t.Fatal(err)
	}
	inner := mw(handler)
	upstream := func(read func(r *http.Request)) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			read(r)
			inner.ServeHTTP(w, r)
		})
	}
	const urlencoded = "application/x-www-form-urlencoded"
	parse := upstream(func(r *http.Request) { r.ParseForm() })
	if rec := serveKeyed(parse, `"form"`, urlencoded, []byte("amount=10")); rec.Code != http.StatusCreated || rec.Body.String() != "charged 10" {
		t.Fatalf("first: %d %q", rec.Code, rec.Body)
	}
	if rec := serveKeyed(parse, `"form"`, urlencoded, []byte("amount=9999")); rec.Code != http.StatusUnprocessableEntity {
		t.Errorf("same key, another form: %d %q, want 422", rec.Code, rec.Body)
	}
	if rec := serveKeyed(parse, `"form"`, urlencoded, []byte("amount=10")); rec.Code != http.StatusCreated || rec.Header().Get(httpmw.ReplayedHeader) != "true" {
		t.Errorf("same key, same form: %d %q replayed=%q, want the first answer replayed", rec.Code, rec.Body, rec.Header().Get(httpmw.ReplayedHeader))
	}

	multipartBody := func(content string) (string, string) {
		var b bytes.Buffer
		mw := multipart.NewWriter(&b)
		mw.WriteField("amount", "10")
		f, _ := mw.CreateFormFile("invoice", "invoice.txt")
		io.WriteString(f, content)
		mw.Close()
		return mw.FormDataContentType(), b.String()
	}
	parseMultipart := upstream(func(r *http.Request) { r.ParseMultipartForm(1 << 20) })
	ct, body := multipartBody("lines: 1")
	if rec := serveKeyed(parseMultipart, `"multipart"`, ct, []byte(body)); rec.Code != http.StatusCreated {
		t.Fatalf("first multipart: %d %q", rec.Code, rec.Body)
	}
	ct, body = multipartBody("lines: 2")
	if rec := serveKeyed(parseMultipart, `"multipart"`, ct, []byte(body)); rec.Code != http.StatusUnprocessableEntity {
		t.Errorf("same key, same fields, another file: %d %q, want 422", rec.Code, rec.Body)
	}

	drain := upstream(func(r *http.Request) { io.Copy(io.Discard, r.Body) })
	if rec := serveKeyed(drain, `"drained"`, "application/json", []byte(`{"amount":10}`)); rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), "Body_consumed") {
		t.Errorf("body read before the middleware: %d %q, want 500 Body_consumed", rec.Code, rec.Body)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2 (the first form, the first multipart)", n)
	}
}

// TestBodyReadUpstream: what a middleware before Idempotency does to the
// body decides what is fingerprinted. A decompressing middleware that
// leaves Content-Length as it was is fingerprinted as decoded, not
// refused; an Idempotency inside another with the same key defers to it
// whatever reads the body between them; a form parsed before it is held
// to WithMaxBody as a body is; and a body read whole before it is logged
// as the server's error.
func TestBodyReadUpstream(t *testing.T) {
	store := idempotency.NewMemoryStore()
	var runs atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "got %s", b)
	})
	var logs strings.Builder
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	mw, err := httpmw.Idempotency(store, httpmw.WithMaxBody(1024), httpmw.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	gunzip := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		r.Body = zr // Content-Length left as the compressed length
		mw(handler).ServeHTTP(w, r)
	})
	gz := func(s string) []byte {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		io.WriteString(zw, s)
		zw.Close()
		return b.Bytes()
	}
	if rec := serveKeyed(gunzip, `"gz"`, "application/json", gz(`{"amount":10}`)); rec.Code != http.StatusCreated || rec.Body.String() != `got {"amount":10}` {
		t.Errorf("body decompressed before the middleware: %d %q, want 201", rec.Code, rec.Body)
	}
	if rec := serveKeyed(gunzip, `"gz"`, "application/json", gz(`{"amount":9999}`)); rec.Code != http.StatusUnprocessableEntity {
		t.Errorf("same key, another decompressed body: %d %q, want 422", rec.Code, rec.Body)
	}

	nested := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mw(handler).ServeHTTP(w, r)
	}))
	if rec := serveKeyed(nested, `"nested"`, "text/plain", []byte("order")); rec.Code != http.StatusCreated {
		t.Errorf("nested, a body reader between: %d %q, want 201", rec.Code, rec.Body)
	}
	if rec := serveKeyed(nested, `"nested"`, "text/plain", []byte("order")); rec.Code != http.StatusCreated || rec.Header().Get(httpmw.ReplayedHeader) != "true" {
		t.Errorf("nested, retried: %d %q, want the first answer replayed", rec.Code, rec.Body)
	}

	parse := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		mw(handler).ServeHTTP(w, r)
	})
	if rec := serveKeyed(parse, `"big form"`, "application/x-www-form-urlencoded", []byte("a="+strings.Repeat("x", 2048))); rec.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("form parsed before the middleware, past WithMaxBody: %d %q, want 413", rec.Code, rec.Body)
	}
	// Held to WithMaxBody as sent, not as encoded again (UTF-8 escaped
	// takes three times its size); and a form of no fields is a form.
	for _, body := range []string{"a=" + strings.Repeat("é", 400), "&"} {
		if rec := serveKeyed(parse, `"form `+fmt.Sprint(len(body))+`"`, "application/x-www-form-urlencoded", []byte(body)); rec.Code != http.StatusCreated {
			t.Errorf("form of %d bytes parsed before the middleware: %d %q, want 201", len(body), rec.Code, rec.Body)
		}
	}

	drain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mw(handler).ServeHTTP(w, r)
	})
	// A DELETE's form body is one ParseForm does not read: drained, then
	// parsed, it is still a body read before the middleware.
	deletes, err := httpmw.Idempotency(store, httpmw.WithMethods(http.MethodDelete), httpmw.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	drainParse := deletes(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("handler of a DELETE whose body was read before the middleware ran")
	}))
	req := httptest.NewRequest(http.MethodDelete, "/", strings.NewReader("a=1"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", `"delete"`)
	io.Copy(io.Discard, req.Body)
	req.ParseForm()
	rec := httptest.NewRecorder()
	drainParse.ServeHTTP(rec, req)
	if rec.Code != http.StatusInternalServerError {
		t.Errorf("DELETE form body read before the middleware: %d %q, want 500", rec.Code, rec.Body)
	}
	if rec := serveKeyed(drain, `"drained"`, "text/plain", []byte("order")); rec.Code != http.StatusInternalServerError {
		t.Errorf("body read whole before the middleware: %d %q, want 500", rec.Code, rec.Body)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "read before the middleware") {
		t.Errorf("body read whole before the middleware: logged %q, want an error", logs.String())
	}
	if n := runs.Load(); n != 4 {
		t.Errorf("handler ran %d times, want 4 (the first decompressed body, the first nested request, the two forms)", n)
	}
}

// serveKeyed POSTs body of contentType to h with the idempotency key key.
func serveKeyed(h http.Handler, key, contentType string, body []byte) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}
