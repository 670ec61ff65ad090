package debugpage_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/backendurl"
	"github.com/warden-go/warden/debugpage"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// TestLookupHasABoundOfItsOwn: the lock backend stops answering, so
// counting the waiters of a held lock takes the whole inspect timeout; the
// idempotency store, on a server that answers, is still looked up: the
// lookup gets a bound of its own rather than what the count left of one.
func TestLookupHasABoundOfItsOwn(t *testing.T) {
	ctx := context.Background()
	addr := drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	proxy := drivertest.StartProxy(t, addr)
	o := backendurl.NewOpener()
	defer o.Close()
	open := func(s string) *backendurl.URL {
		u, err := backendurl.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	locker, err := o.Locker(ctx, open("redis://"+proxy.Addr()), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	store, err := o.Store(ctx, open("redis://"+addr))
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(locker, guard.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	key := "debugpage-bound-" + time.Now().Format("150405.000000000")
	l, err := g.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// The partition heals before the lock is given back.
	defer l.Unlock(ctx)
	defer proxy.Reset()
	if _, err := store.Claim(ctx, idempotency.Claim{Scope: "s", Key: key, Owner: "api-1:o", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	page, err := debugpage.New(g, debugpage.WithStore(store), debugpage.WithInspectTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole()
	w := httptest.NewRecorder()
	page.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/debug/warden?format=json&scope=s&key="+key, nil))
	var v debugpage.View
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	if v.WaitersUnknown == "" {
		t.Fatalf("the waiters of a lock on a backend that stopped answering were counted: %+v", v)
	}
	if v.Lookup == nil || !v.Lookup.Found || v.Lookup.Err != "" {
		t.Errorf("lookup on a store that answers, after the count timed out: %+v; want the record", v.Lookup)
	}
}
