package httpmw_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
)

type userKey struct{}

// authenticate stands for an application's authentication middleware: it
// verifies the bearer token against what the server knows and puts the
// identity it established in the request's context. The idempotency scope
// is read from there, never from something the client says of itself.
func authenticate(tokens map[string]string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, ok := tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		if !ok {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

// A POST retried with the same Idempotency-Key creates one order; the retry
// is answered with the stored response. Keys are scoped by the caller the
// server authenticated, so one caller's key never reaches another's order.
func ExampleIdempotency() {
	idem, err := httpmw.Idempotency(idempotency.NewMemoryStore(),
		// Inside authentication, so the identity it verified is there.
		httpmw.WithScope(func(r *http.Request) string { return r.Context().Value(userKey{}).(string) }))
	if err != nil {
		panic(err)
	}
	orders := 0
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", orders))
		w.WriteHeader(http.StatusCreated)
	})
	srv := httptest.NewServer(authenticate(map[string]string{"token-of-alice": "alice"}, idem(createOrder)))
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"book":1}`))
		req.Header.Set("Authorization", "Bearer token-of-alice")
		req.Header.Set("Idempotency-Key", `"9f1c2e"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Printf("%d %s replayed=%q\n", resp.StatusCode, resp.Header.Get("Location"), resp.Header.Get("Idempotent-Replayed"))
	}
	fmt.Println("orders created:", orders)
	// Output:
	// 201 /orders/1 replayed=""
	// 201 /orders/1 replayed="true"
	// orders created: 1
}

// Withdrawals from one account run one at a time, on every server that
// shares the Guard's backend: a second one that arrives while the first
// runs waits up to WithLockWait, then gets 409 with Retry-After.
func ExampleLock() {
	g, err := guard.New(memory.New()) // a server backend in production
	if err != nil {
		panic(err)
	}
	lock, err := httpmw.Lock(g, func(r *http.Request) string { return "account:" + r.PathValue("id") },
		httpmw.WithLockWait(0)) // refused at once here; DefaultLockWait by default
	if err != nil {
		panic(err)
	}
	running, finish := make(chan struct{}), make(chan struct{})
	withdraw := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// r.Context() is the lock's: it is cancelled, with cause
		// guard.ErrLockLost, if the lock is lost.
		close(running)
		<-finish
	})
	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{id}/withdraw", lock(withdraw))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	first := make(chan int)
	go func() {
		resp, err := http.Post(srv.URL+"/accounts/42/withdraw", "", nil)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-running
	resp, err := http.Post(srv.URL+"/accounts/42/withdraw", "", nil)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println("second withdrawal while the first runs:", resp.StatusCode, resp.Header.Get("Content-Type"))
	close(finish)
	fmt.Println("first withdrawal:", <-first)
	// Output:
	// second withdrawal while the first runs: 409 application/problem+json
	// first withdrawal: 200
}
