package debugpage_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/debugpage"
	"github.com/warden-go/warden/guard"
)

// The page on an operators' listener, asked for JSON while the process
// holds a lock. A service mounts it on a mux of its own, served on
// loopback or an admin network, never beside its public API.
func Example() {
	g, err := guard.New(memory.New(), guard.WithOwner("orders-1"))
	if err != nil {
		panic(err)
	}
	page, err := debugpage.New(g) // debugpage.WithScheduler, WithStore: jobs and records too
	if err != nil {
		panic(err)
	}
	admin := http.NewServeMux()
	admin.Handle("GET /debug/warden", page)
	srv := httptest.NewServer(admin)
	defer srv.Close()

	ctx := context.Background()
	l, err := g.Lock(ctx, "reports/daily")
	if err != nil {
		panic(err)
	}
	defer l.Unlock(ctx)

	resp, err := http.Get(srv.URL + "/debug/warden?format=json")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	var view debugpage.View
	if err := json.NewDecoder(resp.Body).Decode(&view); err != nil {
		panic(err)
	}
	fmt.Println("owner:", view.Owner, "framing:", resp.Header.Get("X-Frame-Options"))
	for _, h := range view.Held {
		fmt.Println("holds", h.Key, "token", h.Token, "waiters", h.Waiters)
	}
	// Output:
	// owner: orders-1 framing: DENY
	// holds reports/daily token 1 waiters 0
}
