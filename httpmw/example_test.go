package httpmw_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
)

// A POST retried with the same Idempotency-Key creates one order; the retry
// is answered with the stored response.
func ExampleIdempotency() {
	idem, err := httpmw.Idempotency(idempotency.NewMemoryStore(),
		// Keys are per principal: place the middleware after authentication.
		httpmw.WithScope(func(r *http.Request) string { return r.Header.Get("X-User") }))
	if err != nil {
		panic(err)
	}
	orders := 0
	srv := httptest.NewServer(idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", orders))
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"book":1}`))
		req.Header.Set("X-User", "alice")
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
