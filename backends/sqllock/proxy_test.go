package sqllock_test

import (
	"net/url"
	"testing"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

// proxied returns dsn, a PostgreSQL URL, through a drivertest.Proxy of its
// own, for a test that cuts or silences the way to the server.
func proxied(t testing.TB, dsn string) (string, *drivertest.Proxy) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := drivertest.StartProxy(t, u.Host)
	u.Host = p.Addr()
	return u.String(), p
}
